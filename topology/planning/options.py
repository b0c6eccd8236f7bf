"""One strategy over a set of slots: valid or not (and why, with a fix), and how fast."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from topology.chips import DECODE_BANDWIDTH_EFFICIENCY, GIB, BackendCost, max_wired_bytes
from topology.facts import Problem
from topology.host_rates import weight_kind
from topology.model.spec import ModelSpec
from topology.planning.placement import (
    RankLoad,
    Slot,
    pipeline_loads,
    split_layers,
    tensor_loads,
)
from topology.planning.predict import (
    RankRate,
    pipeline_seconds,
    tensor_phases,
    tensor_seconds,
    tok_s,
)
from topology.planning.tensor_costs import (
    RankCost,
    balanced_layout,
    rank_costs,
    tensor_layout,
    widths_for,
)
from topology.planning.tensor_shares import TensorLayout


@dataclass(frozen=True)
class Option:
    strategy: str
    loads: tuple[RankLoad, ...]
    seconds: float | None  # predicted seconds per token; None when the option is invalid
    roofline_s: float | None
    problems: tuple[Problem, ...]
    blocker: str  # why it is invalid, as one phrase ("" when valid)
    layout: TensorLayout | None = None  # tensor: every rank's heads and widths
    # tensor: per phase (attention, MLP, head), each rank's predicted seconds per token
    phases: tuple[tuple[float, ...], ...] = ()

    @property
    def valid(self) -> bool:
        return self.seconds is not None

    @property
    def tok_s(self) -> float:
        return tok_s(self.seconds) if self.seconds else 0.0


def gib(n: float) -> str:
    """A byte count for people: GiB (Apple's "GB" of memory), MiB below 1 GiB."""
    if n < GIB:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / GIB:.1f} GiB" if n < 10 * GIB else f"{n / GIB:.0f} GiB"


def rank_rates(spec: ModelSpec, slots: Sequence[Slot], rows: int = 1) -> list[RankRate]:
    """Each rank's measured matmul throughput for this model's weights at `rows` rows, and for
    its activations' own products where they differ (a quantized model's)."""
    activations = spec.activation_dtype
    kind = weight_kind(activations, spec.bits)
    out = []
    for s in slots:
        layer_s, exp_s = s.layer_costs(kind) or (0.0, 0.0)
        memory = s.rates is None or s.rates.device != "cpu"
        own = s.gflops(activations, rows) if activations != kind else None
        out.append(RankRate(s.gflops(kind, rows), memory, layer_s, exp_s, own, s.crowding()))
    return out


def share_weights(spec: ModelSpec, slots: Sequence[Slot]) -> list[float]:
    """What each tensor rank's share is sized by, in GB/s of memory bandwidth: its own, or less
    where its measured compute binds (a CPU node): the bandwidth at which reading a decoding
    token's weights would take as long as computing them (2 FLOPs a weight a row)."""
    per_flop = spec.param_bytes(spec.bits) * spec.scale / 2
    out = []
    for slot, rate in zip(slots, rank_rates(spec, slots), strict=True):
        weight = slot.bandwidth_gbs
        if rate.gflops:
            computes = rate.gflops * per_flop / DECODE_BANDWIDTH_EFFICIENCY  # as busy_s counts
            weight = min(weight, computes) if rate.memory else computes
        out.append(weight)
    return out


def _hosts(slots: Sequence[Slot]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.host for s in slots))


def _listing(counts: Sequence[int]) -> str:
    words = [str(c) for c in counts]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _largest_split(spec: ModelSpec, n: int, context: int) -> int:
    """The most ranks below n that tensor parallel can split this model over (equal shares,
    the planner's own rule); 1 when none can."""
    unit = spec.group_size if spec.bits < 16 and spec.group_size else 1
    # no count above the heads or any width's whole groups can split: skip those tilings
    top = min(n - 1, spec.heads, *(w // unit for w in widths_for(spec).values()))
    for k in range(top, 1, -1):
        if not isinstance(tensor_layout(spec, [1.0] * k, context), str):
            return k
    return 1


def _cannot_split(
    spec: ModelSpec, n: int, what: str, hosts: tuple[str, ...], context: int
) -> Problem:
    # pipeline is only worth naming where pipeline over these n ranks could run at all
    pipeline = not spec.pipeline_refused and spec.layers >= n
    largest = _largest_split(spec, n, context)
    if largest > 1:
        fix = f"Use at most {largest} hosts for tensor parallel"
        fix += ", or `--strategy pipeline`." if pipeline else "."
    elif pipeline:
        fix = "Use `--strategy pipeline`."
    else:
        fix = "Run it on one host: tensor parallel cannot split it over 2 ranks."
    return Problem(
        "tp_cannot_split", "error", hosts, f"tensor parallel over {n} ranks needs {what}", fix
    )


def _wired_mb(needed: int) -> int:
    """A wired limit (MB, as iogpu.wired_limit_mb takes) covering `needed`, rounded up to a GiB."""
    return math.ceil(needed / GIB) * 1024


def _fit_problems(
    spec: ModelSpec, slots: Sequence[Slot], loads: Sequence[RankLoad], strategy: str
) -> tuple[list[Problem], str]:
    """memory_unknown / model_does_not_fit for these loads, and a blocker phrase."""
    n = len(slots)
    unknown = tuple(
        dict.fromkeys(s.host for s in slots if s.usable_bytes is None and s.memory_checked)
    )
    if unknown:
        names = ", ".join(unknown)
        return [
            Problem(
                "memory_unknown", "error", unknown,
                f"the memory of {names} is unknown (no sysctl hw.memsize in its probe)",
                f"Take a new snapshot of {names} (`mlx-cluster topology snapshot`) or set "
                "`wired_limit_gb:` for it in the cluster file.",
            )
        ], f"the memory of {names} is unknown"  # fmt: skip
    per_host: dict[str, list[int]] = {}
    memory: dict[str, int | None] = {}
    for s, load in zip(slots, loads, strict=True):
        need_usable = per_host.setdefault(s.host, [0, 0])
        need_usable[0] += load.needed_bytes
        need_usable[1] += s.usable_bytes or 0
        memory[s.host] = s.memory_bytes
    unchecked = {s.host for s in slots if s.usable_bytes is None}
    over = [(h, nu[0], nu[1]) for h, nu in per_host.items() if nu[0] > nu[1] and h not in unchecked]
    if not over:
        return [], ""
    detail = "; ".join(
        f"{h} needs {gib(need)}, {gib(usable)} usable"
        + (f" of {gib(memory[h] or 0)}" if memory[h] else "")
        for h, need, usable in over
    )
    raise_limit = [
        f"on {h} run `sudo sysctl iogpu.wired_limit_mb={_wired_mb(need)}`"
        for h, need, _ in over
        if memory[h] and need <= max_wired_bytes(memory[h] or 0)
    ]
    fixes = []
    if len(raise_limit) == len(over):
        fixes.append(f"raise the GPU memory limit: {', '.join(raise_limit)} (lasts until reboot)")
    needed = sum(nu[0] for nu in per_host.values())
    usable = sum(nu[1] for nu in per_host.values())
    smaller = [f"{b}-bit ≈ {gib(spec.weight_bytes_at(b))}" for b in (8, 4, 3) if b < spec.bits]
    more = f"use more hosts ({gib(needed)} needed in all, {gib(usable)} usable now)"
    fixes.append(
        f"{more}, a smaller quantization ({', '.join(smaller)}) or a shorter --context"
        if smaller
        else f"{more} or a shorter --context"
    )
    fix = "; or ".join(fixes)
    problem = Problem(
        "model_does_not_fit", "error", tuple(h for h, _, _ in over),
        f"{strategy} over {n}: {gib(spec.weight_bytes)} of weights do not fit: {detail}",
        fix[0].upper() + fix[1:] + ".",
    )  # fmt: skip
    h, need, usable = over[0]
    return [
        problem
    ], f"{strategy} over {n} does not fit ({h} needs {gib(need)}, {gib(usable)} usable)"


def _needed(c: RankCost) -> int:
    return RankLoad((0, 0), int(c.weight_bytes), int(c.kv_cache_bytes)).needed_bytes


def tensor_option(
    spec: ModelSpec, slots: Sequence[Slot], cost: BackendCost, context: int
) -> Option:
    n, hosts = len(slots), _hosts(slots)
    if n > 1 and not spec.tensor_supported:
        blocker = f"mlx-lm has no tensor parallel for model type {spec.model_type}"
        problem = Problem(
            "tp_unsupported",
            "error",
            hosts,
            f"{blocker} (no shard())",
            "Use `--strategy pipeline`.",
        )
        return Option("tensor", (), None, None, (problem,), blocker)
    bandwidths = [s.bandwidth_gbs for s in slots]
    # --local N: slots of one machine share its memory; shares of it are equal anyway
    usable = [s.usable_bytes for s in slots]
    lay = balanced_layout(spec, share_weights(spec, slots), usable, context, _needed)
    if isinstance(lay, str):
        problem = _cannot_split(spec, n, lay, hosts, context)
        return Option("tensor", (), None, None, (problem,), f"tensor over {n} would need {lay}")
    costs = rank_costs(spec, lay, context)
    loads = tuple(tensor_loads(costs, spec.layers))
    fit, fit_blocker = _fit_problems(spec, slots, loads, "tensor")
    if fit:
        return Option("tensor", loads, None, None, tuple(fit), fit_blocker, lay)
    rates = rank_rates(spec, slots)
    seconds, roofline = tensor_seconds(spec, costs, bandwidths, cost, rates)
    phases = tuple(tuple(p) for p in tensor_phases(costs, bandwidths, rates))
    return Option("tensor", loads, seconds, roofline, (), "", lay, phases)


def pipeline_option(
    spec: ModelSpec, slots: Sequence[Slot], cost: BackendCost, context: int
) -> Option:
    n = len(slots)
    if n > 1 and spec.pipeline_refused:
        blocker = f"neither mlx-lm nor mlx-cluster runs {spec.model_type} as pipeline stages"
        problem = Problem(
            "pipeline_unsupported", "error", _hosts(slots), blocker, "Use `--strategy tensor`."
        )
        return Option("pipeline", (), None, None, (problem,), blocker)
    if spec.layers < n:
        blocker = f"pipeline over {n} needs at least {n} layers, the model has {spec.layers}"
        problem = Problem(
            "pipeline_too_few_layers", "error", _hosts(slots), blocker,
            f"Use at most {spec.layers} hosts for pipeline parallel.",
        )  # fmt: skip
        return Option("pipeline", (), None, None, (problem,), blocker)
    loads = tuple(pipeline_loads(spec, split_layers(spec, slots, context), context))
    fit, blocker = _fit_problems(spec, slots, loads, "pipeline")
    if fit:
        return Option("pipeline", loads, None, None, tuple(fit), blocker)
    stages = [load.layers for load in loads]
    seconds, roofline = pipeline_seconds(
        spec, stages, [s.bandwidth_gbs for s in slots], cost, context, rank_rates(spec, slots)
    )
    return Option("pipeline", loads, seconds, roofline, (), "")
