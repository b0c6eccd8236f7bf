"""Tensor parallel over any number of ranks, in unequal shares: who holds which heads and widths.

Attention heads are cut by topology/planning/head_tiling.py: each rank holds one to three
blocks of the grid of heads, one uniform GQA call each. MLP and expert widths are contiguous
column ranges in whole quantization groups. A model with two kinds of attention layers of their
own head counts (Step-3.5's sliding ones) has a second grid (HeadGrid.other), tiled by the same
weights into a second set of blocks a rank (RankShare.other, "attention_other" in the job).
Pure: the planner lays a model out and the rank reads its share back from the job
(`RankShare.from_json`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topology.errors import InputError
from topology.planning.head_tiling import Blocks, HeadGrid, tile_heads

# dense MLP, each routed expert, the shared expert(s), and linear attention's value columns
# (Qwen3.5's gated delta net, cut in whole key heads: each carries its group of value heads)
WIDTHS = ("mlp", "expert", "shared", "linear")
MAX_BLOCKS = 3  # attention calls per rank (head_tiling.run_blocks)


@dataclass(frozen=True)
class RankShare:
    """One rank's slice of every layer."""

    blocks: Blocks  # attention: rectangles of the grid, one GQA call each
    widths: Mapping[str, tuple[int, int]]  # "mlp" / "expert" / "shared" / "linear": [start, end)
    # Step-3.5's sliding layers with head counts of their own: rectangles of grid.other
    other: Blocks = ()

    def kind(self, other: bool) -> RankShare:
        """The share as one attention kind's layers see it: the other kind's blocks as its
        own (Step-3.5's sliding layers), else this share."""
        return RankShare(self.other, self.widths) if other else self

    def heads(self, grid: HeadGrid) -> list[int]:
        """Query head indices in the order the rank holds them (block by block, KV head by
        KV head)."""
        return [
            k * grid.group + c for kv, cols in self.blocks for k in range(*kv) for c in range(*cols)
        ]

    def kv_heads(self) -> list[int]:
        """KV head indices in the order the rank holds them (block by block)."""
        return [k for kv, _ in self.blocks for k in range(*kv)]

    def calls(self) -> list[tuple[int, int]]:
        """(query heads, KV heads) of each block: one uniform attention call each."""
        return [((b - a) * (d - c), b - a) for (a, b), (c, d) in self.blocks]

    @property
    def n_heads(self) -> int:
        return sum(q for q, _ in self.calls())

    @property
    def n_kv(self) -> int:
        return sum(k for _, k in self.calls())

    def replicated(self, grid: HeadGrid) -> bool:
        """Does the rank hold a KV head that another rank holds too?"""
        return grid.kv_heads == 1 or any(cols != (0, grid.group) for _, cols in self.blocks)

    def width(self, name: str) -> int:
        start, end = self.widths.get(name, (0, 0))
        return end - start

    def to_json(self) -> dict[str, Any]:
        blocks = [[*kv, *cols] for kv, cols in self.blocks]
        out: dict[str, Any] = {"attention": blocks}
        if self.other:
            out["attention_other"] = [[*kv, *cols] for kv, cols in self.other]
        return out | {name: list(span) for name, span in self.widths.items()}

    @classmethod
    def from_json(cls, raw: Any, grid: HeadGrid, widths: Mapping[str, int]) -> RankShare:
        """A share from a job, checked against the model it is for (InputError when it does
        not fit: the plan was made for another model)."""
        held = {name for name, width in widths.items() if width}
        keys = {"attention", "attention_other"} if grid.other else {"attention"}
        if not isinstance(raw, Mapping) or set(raw) - {*keys, *held}:
            raise InputError(f"tensor share {raw!r}: not a share of this model (re-plan)")
        blocks = _blocks(raw.get("attention"), grid, "attention")
        other = (
            _blocks(raw.get("attention_other"), grid.other, "attention_other") if grid.other else ()
        )
        spans = {name: _span(raw.get(name), widths[name], name) for name in widths if widths[name]}
        return cls(blocks, spans, other)


def _blocks(blocks: Any, grid: HeadGrid, key: str) -> Blocks:
    """One attention kind's blocks from a job, checked against its grid."""
    if not isinstance(blocks, list) or not blocks or len(blocks) > MAX_BLOCKS:
        raise InputError(
            f"tensor share: {key} {blocks!r} is not a list of 1 to {MAX_BLOCKS} blocks (re-plan)"
        )
    rects = []
    for block in blocks:
        if not isinstance(block, list | tuple) or len(block) != 4:
            raise InputError(f"tensor share: {key} block {block!r} is not [kv, kv, col, col]")
        rects.append(
            (
                _span(list(block[:2]), grid.kv_heads, f"{key} kv"),
                _span(list(block[2:]), grid.group, f"{key} cols"),
            )
        )
    kv = [k for (a, b), _ in rects for k in range(a, b)]
    if len(set(kv)) != len(kv):
        raise InputError(f"tensor share: {key} blocks {blocks!r} repeat a KV head (re-plan)")
    return tuple(rects)


def _span(value: Any, limit: int, key: str) -> tuple[int, int]:
    ok = isinstance(value, list | tuple) and len(value) == 2
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok or not 0 <= value[0] < value[1] <= limit:
        raise InputError(
            f"tensor share: {key} {value!r} is not a range within 0..{limit} (re-plan)"
        )
    return int(value[0]), int(value[1])


def check_cover(shares: Sequence[RankShare], grid: HeadGrid, widths: Mapping[str, int]) -> None:
    """Every query head and every column of every width held by exactly one rank, else one
    InputError: shares that overlap or leave a gap would decode wrong tokens, not fail."""
    kinds = [(grid, False)] + ([(grid.other, True)] if grid.other else [])
    for kind, other in kinds:
        heads = [h for share in shares for h in share.kind(other).heads(kind)]
        if sorted(heads) != list(range(kind.heads)):
            what = "sliding-layer query heads" if other else "query heads"
            raise InputError(
                f"tensor shares hold {len(heads)} {what} for {kind.heads}, not each exactly "
                "once (re-plan)"
            )
    for name, width in widths.items():
        if not width:
            continue
        spans = sorted(share.widths.get(name, (0, 0)) for share in shares)
        ends = [0] + [end for _, end in spans]
        if [start for start, _ in spans] != ends[:-1] or ends[-1] != width:
            raise InputError(f"tensor shares {spans} do not cut the {name} width {width} (re-plan)")


@dataclass(frozen=True)
class TensorLayout:
    grid: HeadGrid
    shares: tuple[RankShare, ...]

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.shares]


def apportion(units: int, weights: Sequence[float]) -> list[int] | None:
    """`units` whole units in proportion to `weights`, at least one each (largest remainder);
    None when there are fewer units than weights."""
    n = len(weights)
    if units < n:
        return None
    total = sum(weights)
    # one unit each up front, the rest by weight: no rank is ever left empty
    quotas = [(units - n) * w / total for w in weights]
    counts = [1 + math.floor(q) for q in quotas]
    order = sorted(range(n), key=lambda i: (counts[i] - 1 - quotas[i], i))
    for i in order[: units - sum(counts)]:
        counts[i] += 1
    return counts


def split_width(width: int, weights: Sequence[float], unit: int) -> list[tuple[int, int]] | None:
    """Contiguous column ranges of `width` in whole units (quantization groups); a remainder
    smaller than a unit goes to the last rank. None when there are fewer units than ranks."""
    counts = apportion(width // unit, weights)
    if counts is None:
        return None
    spans, start = [], 0
    for i, count in enumerate(counts):
        end = width if i == len(counts) - 1 else start + count * unit
        spans.append((start, end))
        start = end
    return spans


def layout(
    grid: HeadGrid, widths: Mapping[str, int], units: Mapping[str, int], weights: Sequence[float]
) -> TensorLayout | str:
    """Every rank's share for `weights` (one per rank), or one phrase saying what cannot split.
    `units[name]`: the column granularity of that width (its quantization group, else 1)."""
    n = len(weights)
    tiles = tile_heads(grid, weights)
    if tiles is None:
        return _untiled(grid, n, "attention heads")
    # Step-3.5's sliding layers' own heads, shared by the same weights
    others = tile_heads(grid.other, weights) if grid.other else [()] * n
    if others is None:
        assert grid.other is not None
        return _untiled(grid.other, n, "sliding-layer attention heads")
    spans: dict[str, list[tuple[int, int]]] = {}
    for name, width in widths.items():
        if not width:
            continue
        split = split_width(width, weights, units.get(name, 1))
        if split is None:
            unit = units.get(name, 1)
            return f"{name} width {width} in at least {n} pieces of {unit} columns"
        spans[name] = split
    shares = tuple(
        RankShare(blocks, {name: spans[name][r] for name in spans}, others[r])
        for r, blocks in enumerate(tiles)
    )
    return TensorLayout(grid, shares)


def _untiled(grid: HeadGrid, n: int, what: str) -> str:
    if grid.heads < n:
        return f"at least {n} {what} (the model has {grid.heads})"
    return (
        f"{what} in whole quantization groups of {grid.group_size} columns "
        f"({grid.heads} heads of {grid.out_dim})"
    )
