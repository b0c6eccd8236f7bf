"""Tensor parallel over any number of ranks, in unequal shares: who holds which heads and widths.

Attention heads are cut by topology/planning/head_tiling.py: each rank holds one to three
blocks of the grid of heads, one uniform GQA call each. MLP and expert widths are contiguous
column ranges in whole quantization groups. Pure: the planner lays a model out and the rank
reads its share back from the job (`RankShare.from_json`).
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
        return {"attention": blocks} | {name: list(span) for name, span in self.widths.items()}

    @classmethod
    def from_json(cls, raw: Any, grid: HeadGrid, widths: Mapping[str, int]) -> RankShare:
        """A share from a job, checked against the model it is for (InputError when it does
        not fit: the plan was made for another model)."""
        held = {name for name, width in widths.items() if width}
        if not isinstance(raw, Mapping) or set(raw) - {"attention", *held}:
            raise InputError(f"tensor share {raw!r}: not a share of this model (re-plan)")
        blocks = raw.get("attention")
        if not isinstance(blocks, list) or not blocks or len(blocks) > MAX_BLOCKS:
            raise InputError(
                f"tensor share: attention {blocks!r} is not a list of 1 to {MAX_BLOCKS} blocks "
                "(re-plan)"
            )
        rects = []
        for block in blocks:
            if not isinstance(block, list | tuple) or len(block) != 4:
                raise InputError(
                    f"tensor share: attention block {block!r} is not [kv, kv, col, col]"
                )
            rects.append(
                (
                    _span(list(block[:2]), grid.kv_heads, "attention kv"),
                    _span(list(block[2:]), grid.group, "attention cols"),
                )
            )
        kv = [k for (a, b), _ in rects for k in range(a, b)]
        if len(set(kv)) != len(kv):
            raise InputError(
                f"tensor share: attention blocks {blocks!r} repeat a KV head (re-plan)"
            )
        spans = {name: _span(raw.get(name), widths[name], name) for name in widths if widths[name]}
        return cls(tuple(rects), spans)


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
    heads = [h for share in shares for h in share.heads(grid)]
    if sorted(heads) != list(range(grid.heads)):
        raise InputError(
            f"tensor shares hold {len(heads)} query heads for {grid.heads}, not each exactly "
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
        if grid.heads < n:
            return f"at least {n} attention heads (the model has {grid.heads})"
        return (
            f"attention heads in whole quantization groups of {grid.group_size} columns "
            f"({grid.heads} heads of {grid.out_dim})"
        )
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
        RankShare(blocks, {name: spans[name][r] for name in spans})
        for r, blocks in enumerate(tiles)
    )
    return TensorLayout(grid, shares)
