"""The placement plan: which rank runs which layers where, over which backend, how fast.

Pure functions of a CheckResult (or this machine's facts for --local N) and a ModelSpec.
`auto` evaluates tensor and pipeline and keeps the fastest valid one by the prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from topology.addresses import rank_addresses
from topology.chips import (
    BACKENDS,
    PREFILL_ROWS,
    BackendCost,
    assumed_rates,
    gpu_chip,
    host_bandwidth_gbs,
    usable_memory_bytes,
)
from topology.errors import InputError
from topology.facts import CheckResult, HostFacts, Problem
from topology.host_rates import HostRates, weight_kind
from topology.links import LinkGraph, find_ring
from topology.model.spec import ModelSpec
from topology.planning.calibration import (
    Calibration,
    calibrated_bandwidth,
    calibrated_cost,
    calibration_notes,
)
from topology.planning.hostfile import RDMA_BACKENDS, missing_devices, rdma_matrix
from topology.planning.memory_input import check_weights_fit, check_wired_limits
from topology.planning.options import Option, pipeline_option, tensor_option
from topology.planning.placement import Slot
from topology.planning.predict import LOCKSTEP_WAIT, tensor_comms_s, tok_s
from topology.planning.prefill import DEFAULT_PROMPT_TOKENS, compute_source, ttft_seconds
from topology.planning.tensor_costs import share_summary
from topology.planning.types import DEFAULT_CONTEXT, Plan, RankPlan
from topology.problems import unknown_hosts

__all__ = ["DEFAULT_CONTEXT", "Plan", "RankPlan", "model_problems", "plan_cluster", "plan_local"]
STRATEGIES = ("auto", "tensor", "pipeline")
ASSUMED_BANDWIDTH_GBS = 100.0  # only for chips not in topology/chips.py: ranks stay comparable
LOCAL_IP = "127.0.0.1"  # mlx.launch runs a host named 127.0.0.1 locally, without ssh
MAX_CONTEXT = 16 << 20  # tokens, for models whose config.json gives no max_position_embeddings


def plan_context(spec: ModelSpec, context: int | None) -> int:
    """The context to reserve KV cache for: None means the default, capped at what the model
    supports; an asked-for context beyond `max_position_embeddings` is one line (exit 2)."""
    limit = spec.max_context or MAX_CONTEXT
    # The CLI hands its default over as a plain 4096: a model built for less is not refused for it.
    if context is None or (context == DEFAULT_CONTEXT and limit < DEFAULT_CONTEXT):
        return min(DEFAULT_CONTEXT, limit)
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InputError(f"--context: must be a number of tokens of at least 1, got {context!r}")
    if context > limit:
        why = (
            f"the model's max_position_embeddings ({limit:,}, {spec.source})"
            if spec.max_context
            else f"{limit:,} tokens"
        )
        raise InputError(f"--context {context:,}: more than {why}; give --context {limit} or less")
    return context


def _choose(options: Sequence[Option], strategy: str, n: int) -> tuple[Option | None, str]:
    """The option to use and the one-sentence reason."""
    valid = sorted((o for o in options if o.valid), key=lambda o: o.seconds or 0.0)
    if strategy != "auto":
        asked = next(o for o in options if o.strategy == strategy)
        if asked.valid:
            return asked, f"{strategy} over {n} as requested: {asked.tok_s:.1f} tok/s predicted"
        return None, f"no valid plan: {asked.blocker}"
    if not valid:
        return None, "no valid plan: " + "; ".join(o.blocker for o in options)
    best = valid[0]
    if n == 1:
        return best, f"one rank holds the whole model: {best.tok_s:.1f} tok/s predicted"
    if len(valid) == 1:
        other = next(o for o in options if o is not best)
        return best, f"{other.blocker}; {best.strategy} over {n} instead"
    slower = valid[1]
    return best, (
        f"{best.strategy} over {n} is fastest: {best.tok_s:.1f} tok/s predicted "
        f"vs {slower.tok_s:.1f} for {slower.strategy}"
    )


def _assumptions(
    hosts: Sequence[HostFacts],
    calibration: Calibration | None = None,
    cost_name: str = "",
    kind: str = "bfloat16",  # the model's weight kind, whose assumed rate is named
    ranks: int | None = None,  # --local N: ranks on the one host (else one a host)
) -> list[str]:
    unchecked = [
        f"the memory of {h.name} (not a Mac) is unknown: not checked (set wired_limit_gb for it "
        "in the cluster file to have it checked)"
        for h in hosts
        if not h.is_mac and usable_memory_bytes(h) is None
    ]
    unchecked += calibration_notes(calibration, [h.name for h in hosts], cost_name, ranks)
    unchecked += [
        f"memory bandwidth of {h.name} ({h.chip or 'chip unknown'}) is not in the chip table: "
        f"assumed {ASSUMED_BANDWIDTH_GBS:.0f} GB/s (set bandwidth_gbs for it in the cluster file)"
        for h in hosts
        if _bandwidth(h, calibration) is None
    ]
    unchecked += _compute_notes([h for h in hosts if h.rates is None], kind)
    return unchecked


def _compute_notes(unmeasured: Sequence[HostFacts], kind: str) -> list[str]:
    """What was assumed of hosts without rates.json: a Mac in the chip table gets its figure
    (one line per chip and bin), anything else is planned by memory alone."""
    by_chip: dict[tuple[str, int], list[str]] = {}
    figures: dict[tuple[str, int], float] = {}
    alone = []
    for h in unmeasured:
        rates = assumed_rates(h)
        gpu = gpu_chip(h.chip, h.memory_bytes)
        if rates is None or gpu is None:
            alone.append(h.name)
            continue
        by_chip.setdefault((gpu.key, gpu.cores), []).append(h.name)
        figures[(gpu.key, gpu.cores)] = (rates.gflops(kind, PREFILL_ROWS) or 0.0) / 1e3
    notes = [
        f"compute of {', '.join(names)} not measured: {key} ({cores}-core GPU) {PREFILL_ROWS}-row "
        f"{kind} matmul assumed at {figures[(key, cores)]:.1f} TFLOP/s from the chip table "
        "(prefill and time to first token rest on it); run `mlx-cluster topology check` "
        "(the microbenchmark, rates.json) to measure it"
        for (key, cores), names in by_chip.items()
    ]
    if alone:
        notes.append(
            f"compute of {', '.join(alone)} not measured (no rates.json): predicted from "
            "memory bandwidth alone, too fast where compute binds (prefill, CPU hosts)"
        )
    return notes


def _kind(spec: ModelSpec) -> str:
    """The weight kind whose rate the model's matmuls run at (as options.rank_rates asks)."""
    return weight_kind(spec.activation_dtype, spec.bits)


def _rates(h: HostFacts) -> HostRates | None:
    """Measured rates win; a Mac never measured gets its chip table figure."""
    return h.rates or assumed_rates(h)


def _bandwidth(h: HostFacts, calibration: Calibration | None) -> float | None:
    """Memory bandwidth: bench --calibrate's, a non-Mac's measured copy rate, the chip table's."""
    copied = h.rates.copy_gbs if h.rates and not h.is_mac else None
    return calibrated_bandwidth(h.name, calibration) or copied or host_bandwidth_gbs(h)


def _as_warnings(problems: Sequence[Problem]) -> list[Problem]:
    return [replace(p, severity="warning") for p in problems]


def _plan(
    spec: ModelSpec,
    slots: Sequence[Slot],
    strategy: str,
    backend: str | None,
    cost_name: str,
    context: int | None,
    base: Sequence[Problem],
    calibration: Calibration | None = None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    staged: Sequence[Slot] | None = None,  # pipeline's slots where they differ (--local N)
    **extra: Any,
) -> Plan:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    context = plan_context(spec, context)
    n = len(slots)
    cost = calibrated_cost(cost_name, BACKENDS[cost_name], calibration, n)
    staged = staged or slots
    options = [
        tensor_option(spec, slots, cost, context),
        pipeline_option(spec, staged, cost, context),
    ]
    if n == 1:  # one rank: nothing is split, the strategies are the same
        options = [replace(options[0], strategy="tensor" if strategy == "auto" else strategy)]
    chosen, reason = _choose(options, strategy, n)
    if chosen is None:
        check_weights_fit(slots, options, strategy)
    problems = list(base)
    for o in options:
        if o is chosen or o.strategy == strategy or chosen is None:
            problems += o.problems
        else:
            problems += _as_warnings(o.problems)
    blocked = backend is None or any(p.severity == "error" for p in problems)
    if chosen is None or blocked:
        first = next((p for p in problems if p.severity == "error"), None)
        if chosen is not None:
            reason = f"no valid plan: {first.message if first else 'no backend works'}"
        return Plan(
            strategy,  # "auto" when nothing was chosen
            backend, spec.source, (), None, reason, tuple(problems), context,
            model_info=spec.summary(), **extra,
        )  # fmt: skip
    if chosen.strategy == "pipeline":
        slots = staged
    ranks = tuple(
        RankPlan(
            rank=r,
            host=s.host,
            layers=load.layers,
            ip=s.ip,
            memory_needed_bytes=load.needed_bytes,
            memory_usable_bytes=s.usable_bytes,
            ssh=s.ssh,
            weight_bytes=load.weight_bytes,
            kv_cache_bytes=load.kv_cache_bytes,
            bandwidth_gbs=round(s.bandwidth_gbs, 1),
            **_tensor_fields(chosen, r, cost, spec),
        )
        for r, (s, load) in enumerate(zip(slots, chosen.loads, strict=True))
    )
    ttft = ttft_seconds(spec, chosen, slots, cost, prompt_tokens)
    return Plan(
        chosen.strategy, backend, spec.source, ranks, chosen.tok_s, reason, tuple(problems),
        context, roofline_decode_tok_s=tok_s(chosen.roofline_s or 0.0),
        model_info=spec.summary(), prompt_tokens=prompt_tokens,
        predicted_ttft_s=round(ttft, 4) if ttft else None,
        predicted_prefill_tok_s=round(prompt_tokens / ttft, 1) if ttft else None,
        compute_source=compute_source(slots) if ttft else None, **extra,
    )  # fmt: skip


def _tensor_fields(option: Option, r: int, cost: BackendCost, spec: ModelSpec) -> dict[str, Any]:
    """A tensor rank's share, what it reads per token and its own predicted step time."""
    if option.strategy != "tensor" or option.layout is None or len(option.loads) < 2:
        return {}
    share = option.layout.shares[r]
    n = len(option.loads)
    busy = sum(phase[r] for phase in option.phases)
    comms = tensor_comms_s(spec, n, cost)
    return {
        "tensor_share": share.to_json(),
        "share_summary": share_summary(share, option.layout),
        "read_bytes_per_token": int(option.loads[r].read_bytes),
        "predicted_step_s": round(busy + comms, 6),
    }


def _ordered(check: CheckResult, backend: str | None) -> list[HostFacts]:
    """Rank order: the hosts' order, or a cabled ring through them for ring backends."""
    hosts = list(check.hosts)
    if backend in ("ring", "jaccl-ring") and len(hosts) > 2:
        names = [h.name for h in hosts]
        ring = find_ring(LinkGraph(tuple(names), check.links), names, rdma=backend == "jaccl-ring")
        if ring:
            by_name = {h.name: h for h in hosts}
            hosts = [by_name[name] for name in ring]
    return hosts


def _address_problems(
    hosts: Sequence[HostFacts], ips: Sequence[str | None], backend: str
) -> list[Problem]:
    need = range(len(hosts)) if backend == "ring" else range(min(1, len(hosts)))
    what = (
        "its address on the cable to its ring neighbour"
        if backend == "ring"
        else ("a LAN address every other host can reach (the jaccl coordinator)")
    )
    return [
        Problem(
            "no_rank_address", "error", (hosts[i].name,),
            f"rank {i} ({hosts[i].name}) needs {what}, and none is known",
            f"Add `ips: [<address>]` for {hosts[i].name} in the cluster file "
            "(or a host.yaml in its snapshot directory).",
        )
        for i in need
        if len(hosts) > 1 and ips[i] is None
    ]  # fmt: skip


def _device_problems(hosts: Sequence[HostFacts], check: CheckResult, backend: str) -> list[Problem]:
    """Pairs needing an rdma_enX none is known for (mlx.launch would refuse the hostfile)."""
    names = [h.name for h in hosts]
    ring = backend == "jaccl-ring"
    pairs = missing_devices(names, rdma_matrix(names, check.links, ring), ring)
    missing = list(dict.fromkeys(tuple(sorted(pair)) for pair in pairs))
    return [
        Problem(
            "no_rdma_device", "error", (a, b),
            f"{backend} needs an RDMA device from {a} to {b} and none is known",
            "Run `mlx-cluster topology check` and fix the cabling/RDMA problems it lists, "
            "or use `--backend ring`.",
        )
        for a, b in missing
        if len(names) > 1
    ]  # fmt: skip


def _slots(
    hosts: Sequence[HostFacts], ips: Sequence[str | None], calibration: Calibration | None = None
) -> list[Slot]:
    return [
        Slot(
            host=h.name,
            ssh=h.ssh or h.name,
            usable_bytes=usable_memory_bytes(h),
            memory_bytes=h.memory_bytes,
            bandwidth_gbs=_bandwidth(h, calibration) or ASSUMED_BANDWIDTH_GBS,
            ip=ip,
            memory_checked=h.is_mac,
            limit_given=h.wired_limit_bytes is not None,
            rates=_rates(h),
        )
        for h, ip in zip(hosts, ips, strict=True)
    ]


def plan_cluster(
    check: CheckResult,
    spec: ModelSpec,
    *,
    strategy: str = "auto",
    backend: str | None = None,
    context: int | None = None,  # None: DEFAULT_CONTEXT, capped at the model's
    calibration: Calibration | None = None,  # measured numbers (bench --calibrate)
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,  # the prompt TTFT is predicted for
) -> Plan:
    """Plan over the checked hosts. backend None/"auto": the best one the check found."""
    chosen: str | None
    if unknown_hosts(check.hosts):  # an unreachable or unidentified host: nothing to plan on
        chosen, base = None, list(check.problems)
    elif backend in (None, "auto"):
        chosen = check.backend if len(check.hosts) > 1 else check.backend or "ring"
        # Errors of an auto check block jaccl; with a slower backend they are only warnings.
        base = list(check.problems) if chosen is None else _as_warnings(check.problems)
    else:
        chosen, base = backend, list(check.problems)
    hosts = _ordered(check, chosen)
    check_wired_limits(hosts)
    ips = rank_addresses(hosts, check.links, chosen or "ring")
    if chosen is not None:
        base += _address_problems(hosts, ips, chosen)
    if chosen in RDMA_BACKENDS and not any(p.severity == "error" for p in base):
        base += _device_problems(hosts, check, chosen)
    return _plan(
        spec, _slots(hosts, ips, calibration), strategy, chosen, chosen or "ring", context, base,
        calibration, prompt_tokens,
        assumptions=tuple(_assumptions(hosts, calibration, chosen or "ring", _kind(spec))),
    )  # fmt: skip


def plan_local(
    host: HostFacts,
    n: int,
    spec: ModelSpec,
    *,
    strategy: str = "auto",
    context: int | None = None,  # None: DEFAULT_CONTEXT, capped at the model's
    calibration: Calibration | None = None,  # measured numbers (bench --calibrate)
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,  # the prompt TTFT is predicted for
    share_rates: HostRates | None = None,
) -> Plan:
    """N ranks on this machine over the ring backend on 127.0.0.1, sharing memory and bandwidth.
    `share_rates`: the host's rates as measured on a tensor rank's share of the model's matrices
    (float32 on OpenBLAS: narrower matrices run at rates of their own), for the tensor ranks;
    pipeline stages multiply by whole layers at the host's."""
    if n < 1:
        raise ValueError("--local needs at least 1 rank")
    check_wired_limits([host])
    usable = usable_memory_bytes(host)
    bandwidth = _bandwidth(host, calibration) or ASSUMED_BANDWIDTH_GBS
    slot = Slot(
        "localhost",
        LOCAL_IP,
        usable // n if usable else None,
        host.memory_bytes,
        bandwidth / n,
        LOCAL_IP,
        limit_given=host.wired_limit_bytes is not None,
        # the ranks share this machine's cores as they share its memory bandwidth
        rates=share_rates or _rates(host),
        ranks_here=n,
    )
    notes = [
        f"{n} ranks share this machine's memory and memory bandwidth",
        *_assumptions([host], calibration, "ring-local", _kind(spec), ranks=n),
    ]
    rates = host.rates
    if rates is not None and rates.device == "cpu" and n > rates.threads:
        whole = rates.crowding(n)[1]
        notes.append(
            f"{n} ranks share {rates.threads} cores: each computes {rates.threads}/{n} of the "
            "time, and a rank waiting on another cannot make it go faster; a tensor rank's "
            f"short work between two all-reduces runs to its end on one core ({whole:g}x its "
            "time alone, not the even share)"
        )
    elif rates is not None and rates.device == "cpu" and n > 1:
        notes.append(
            "tensor ranks on cores of their own wait at every all-reduce for the slower one: "
            f"{LOCKSTEP_WAIT:.0%} of their compute (measured on a 2-core machine)"
        )
    # Pipeline stages take turns: the one computing has the memory bandwidth and its cores to
    # itself (measured here: pipeline x2 and x3 decode at 0.9x one rank, not at half of it).
    stage = replace(slot, bandwidth_gbs=bandwidth, computes_alone=True, rates=_rates(host))
    return _plan(
        spec, [slot] * n, strategy, "ring", "ring-local", context, [], calibration,
        prompt_tokens, [stage] * n, local=True, assumptions=tuple(notes),
    )  # fmt: skip


def model_problems(
    check: CheckResult,
    spec: ModelSpec,
    context: int | None,
    n: int | None = None,
    strategy: str = "auto",
) -> list[Problem]:
    """What the model means for this cluster (for `topology check --model`): model_does_not_fit,
    tp_not_divisible, ...; a tensor-only problem is a warning when pipeline would work."""
    context = plan_context(spec, context)
    hosts = list(check.hosts[:n] if n else check.hosts)
    slots = _slots(hosts, [None] * len(hosts))
    cost = BACKENDS[check.backend or "ring"]
    t = tensor_option(spec, slots, cost, context)
    p = pipeline_option(spec, slots, cost, context)
    if strategy == "tensor" or (strategy == "auto" and len(hosts) == 1):
        return list(t.problems)
    if strategy == "pipeline":
        return list(p.problems)
    if t.valid:
        return []
    if p.valid:
        return _as_warnings(t.problems)
    seen: set[tuple[str, str]] = set()
    out = []
    for prob in [*t.problems, *p.problems]:
        if (prob.code, prob.message) not in seen:
            seen.add((prob.code, prob.message))
            out.append(prob)
    return out
