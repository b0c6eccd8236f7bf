"""One strategy over a set of slots: valid or not (and why, with a fix), and how fast."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from topology.chips import GIB, BackendCost, max_wired_bytes
from topology.facts import Problem
from topology.model.spec import ModelSpec
from topology.planning.placement import (
    RankLoad,
    Slot,
    pipeline_loads,
    split_layers,
    tensor_blockers,
    tensor_loads,
    tensor_sizes,
)
from topology.planning.predict import pipeline_seconds, tensor_seconds, tok_s


@dataclass(frozen=True)
class Option:
    strategy: str
    loads: tuple[RankLoad, ...]
    seconds: float | None  # predicted seconds per token; None when the option is invalid
    roofline_s: float | None
    problems: tuple[Problem, ...]
    blocker: str  # why it is invalid, as one phrase ("" when valid)

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


def _hosts(slots: Sequence[Slot]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.host for s in slots))


def _listing(counts: Sequence[int]) -> str:
    words = [str(c) for c in counts]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _not_divisible(spec: ModelSpec, n: int, rules: list[str], hosts: tuple[str, ...]) -> Problem:
    note = ""
    if any("KV heads" in r for r in rules):
        note = (
            " (mlx-lm's shard() does not check KV heads: it loads, then fails at the first token)"
        )
    sizes = tensor_sizes(spec, max(8, n))
    fix = "Use `--strategy pipeline`."
    if sizes:
        fix = f"Use {_listing(sizes)} hosts for tensor parallel, or `--strategy pipeline`."
    return Problem(
        "tp_not_divisible", "error", hosts,
        f"tensor parallel over {n} ranks needs {', '.join(rules)}{note}", fix,
    )  # fmt: skip


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


def tensor_option(
    spec: ModelSpec, slots: Sequence[Slot], cost: BackendCost, context: int
) -> Option:
    n, hosts = len(slots), _hosts(slots)
    problems: list[Problem] = []
    blocker = ""
    if n > 1 and not spec.tensor_supported:
        blocker = f"mlx-lm has no tensor parallel for model type {spec.model_type}"
        problems.append(
            Problem(
                "tp_unsupported",
                "error",
                hosts,
                f"{blocker} (no shard())",
                "Use `--strategy pipeline`.",
            )
        )
    elif n > 1 and (rules := tensor_blockers(spec, n)):
        blocker = f"tensor over {n} would need {rules[0]}"
        problems.append(_not_divisible(spec, n, rules, hosts))
    loads = tuple(tensor_loads(spec, n, context))
    fit, fit_blocker = _fit_problems(spec, slots, loads, "tensor")
    problems += fit
    if problems:
        return Option("tensor", loads, None, None, tuple(problems), blocker or fit_blocker)
    seconds, roofline = tensor_seconds(spec, [s.bandwidth_gbs for s in slots], cost, context)
    return Option("tensor", loads, seconds, roofline, (), "")


def pipeline_option(
    spec: ModelSpec, slots: Sequence[Slot], cost: BackendCost, context: int
) -> Option:
    n = len(slots)
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
        spec, stages, [s.bandwidth_gbs for s in slots], cost, context
    )
    return Option("pipeline", loads, seconds, roofline, (), "")
