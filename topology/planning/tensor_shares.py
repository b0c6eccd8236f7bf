"""Tensor parallel over any number of ranks, in unequal shares: who holds which heads and widths.

Query heads form a grid of KV heads (rows) by the query heads each serves (columns). Every
rank takes one rectangle of it, so its attention stays one uniform GQA call: `rows` KV heads,
each serving `columns` of its query heads. Cutting columns replicates a KV head on the ranks
that share it; the tiling minimises the slowest rank's attention time for the given weights.
MLP and expert widths are contiguous column ranges in whole quantization groups. Pure: the
planner lays a model out and the rank reads its share back from the job (`RankShare.from_json`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from topology.errors import InputError

WIDTHS = ("mlp", "expert", "shared")  # dense MLP, each routed expert, the shared expert(s)


@dataclass(frozen=True)
class HeadGrid:
    """What attention looks like to the splitter; the same numbers on the planner and a rank."""

    heads: int  # query heads
    kv_heads: int  # KV heads (1 for MLA: its latent cache is whole on every rank)
    out_dim: int  # columns of the output projection per head (head_dim; MLA: v_head_dim)
    group_size: int | None  # quantization group along the output projection's input, or None
    q_cost: float = 1.0  # bytes read per query head (its q and o projections)
    kv_cost: float = 1.0  # bytes read per KV head held (k, v projections and its cache)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def aligned(self, rows: tuple[int, int], cols: tuple[int, int]) -> bool:
        """Can a quantized output projection be cut at every head run of this rectangle?"""
        if not self.group_size:
            return True
        if cols == (0, self.group):  # whole KV groups: one run of columns
            starts = [rows[0] * self.group, rows[1] * self.group]
        else:
            starts = [k * self.group + c for k in range(*rows) for c in cols]
        return all(s * self.out_dim % self.group_size == 0 for s in starts)


@dataclass(frozen=True)
class RankShare:
    """One rank's slice of every layer."""

    kv: tuple[int, int]  # KV heads [start, end)
    cols: tuple[int, int]  # of each such KV head's query heads, [start, end)
    widths: Mapping[str, tuple[int, int]]  # "mlp" / "expert" / "shared": columns [start, end)

    def heads(self, grid: HeadGrid) -> list[int]:
        """Query head indices in the order the rank holds them (KV head by KV head)."""
        return [k * grid.group + c for k in range(*self.kv) for c in range(*self.cols)]

    @property
    def n_heads(self) -> int:
        return (self.kv[1] - self.kv[0]) * (self.cols[1] - self.cols[0])

    @property
    def n_kv(self) -> int:
        return self.kv[1] - self.kv[0]

    def width(self, name: str) -> int:
        start, end = self.widths.get(name, (0, 0))
        return end - start

    def to_json(self) -> dict[str, Any]:
        return {"kv": list(self.kv), "cols": list(self.cols)} | {
            name: list(span) for name, span in self.widths.items()
        }

    @classmethod
    def from_json(cls, raw: Any, grid: HeadGrid, widths: Mapping[str, int]) -> RankShare:
        """A share from a job, checked against the model it is for (InputError when it does
        not fit: the plan was made for another model)."""
        held = {name for name, width in widths.items() if width}
        if not isinstance(raw, Mapping) or set(raw) - {"kv", "cols", *held}:
            raise InputError(f"tensor share {raw!r}: not a share of this model (re-plan)")
        kv = _span(raw.get("kv"), grid.kv_heads, "kv")
        cols = _span(raw.get("cols"), grid.group, "cols")
        spans = {name: _span(raw.get(name), widths[name], name) for name in widths if widths[name]}
        return cls(kv, cols, spans)


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


Rect = tuple[tuple[int, int], tuple[int, int]]  # (KV rows, columns)


@dataclass(frozen=True)
class Tiling:
    slowest: float  # the largest cost over weight of its ranks
    fastest: float
    kv: int  # KV heads held, replicas counted
    rects: tuple[Rect, ...]

    @property
    def key(self) -> tuple[float, float, int]:
        # 9 significant digits: equal costs summed in another order still tie
        return float(f"{self.slowest:.9g}"), self.slowest - self.fastest, self.kv


def tile_heads(grid: HeadGrid, weights: Sequence[float]) -> list[Rect] | None:
    """One rectangle per rank, in rank order, minimising the slowest rank's attention time
    (its cost over its weight); None when the heads cannot be split that many ways."""
    if grid.heads < len(weights):
        return None
    w = tuple(float(x) for x in weights)
    # Cuts a little off the proportional one let quantized heads align; with many ranks or
    # heads (beyond any real model) only the proportional cuts are tried, to stay fast.
    spread = 2 if grid.heads <= 256 else 0

    def cost(rect: Rect, r: int) -> float:
        rows, cols = rect[0][1] - rect[0][0], rect[1][1] - rect[1][0]
        return (rows * cols * grid.q_cost + rows * grid.kv_cost) / w[r]

    @cache
    def best(rect: Rect, lo: int, hi: int) -> Tiling | None:
        """The best tiling of `rect` for ranks lo..hi-1: the slowest rank first, then the
        most even (an idle rank's time cannot move to another phase), then the fewest KV
        heads held."""
        (r0, r1), (c0, c1) = rect
        if hi - lo == 1:
            if not grid.aligned(rect[0], rect[1]):
                return None
            c = cost(rect, lo)
            return Tiling(c, c, r1 - r0, (rect,))
        found: Tiling | None = None
        # Beyond 8 ranks (no Mac cluster has more): halve the ranks, first cut that works.
        for mid in range(lo + 1, hi) if hi - lo <= 8 else [(lo + hi) // 2]:
            frac = sum(w[lo:mid]) / sum(w[lo:hi])
            for axis, (a, b) in ((0, (r0, r1)), (1, (c0, c1))):
                for cut in _cuts(a, b, frac, spread):
                    if axis == 0:
                        left, right = ((a, cut), (c0, c1)), ((cut, b), (c0, c1))
                    else:
                        left, right = ((r0, r1), (a, cut)), ((r0, r1), (cut, b))
                    one, two = best(left, lo, mid), best(right, mid, hi)
                    if one is None or two is None:
                        continue
                    got = Tiling(
                        max(one.slowest, two.slowest),
                        min(one.fastest, two.fastest),
                        one.kv + two.kv,
                        one.rects + two.rects,
                    )
                    if found is None or got.key < found.key:
                        found = got
                    if hi - lo > 8:
                        return found
        return found

    result = best(((0, grid.kv_heads), (0, grid.group)), 0, len(w))
    return list(result.rects) if result else None


def _cuts(a: int, b: int, frac: float, spread: int) -> list[int]:
    """Cut positions near the proportional one: a few either side, so alignment can be met."""
    target = a + (b - a) * frac
    near = range(math.floor(target) - spread, math.ceil(target) + spread + 1)
    return [c for c in near if a < c < b]


def layout(
    grid: HeadGrid, widths: Mapping[str, int], units: Mapping[str, int], weights: Sequence[float]
) -> TensorLayout | str:
    """Every rank's share for `weights` (one per rank), or one phrase saying what cannot split.
    `units[name]`: the column granularity of that width (its quantization group, else 1)."""
    n = len(weights)
    rects = tile_heads(grid, weights)
    if rects is None:
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
        RankShare(rows, cols, {name: spans[name][r] for name in spans})
        for r, (rows, cols) in enumerate(rects)
    )
    return TensorLayout(grid, shares)
