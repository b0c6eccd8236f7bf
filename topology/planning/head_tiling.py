"""Which attention heads each rank takes: the grid of heads, cut into one to three blocks a rank.

Query heads form a grid: one row per KV head, one column per query head it serves. A rank's
attention is one uniform GQA call per block it holds (a rectangle: some KV heads, the same
columns of each). Two kinds of tiling are searched and the faster kept:
- guillotine cuts, one rectangle a rank (one call): exhaustive up to 8 ranks;
- runs of heads in row order (a row's tail, whole rows, the next row's head: up to three
  calls), cut by dynamic programming. Runs even out shapes rectangles cannot, e.g. 64 heads on
  8 KV heads over 3 ranks, where rectangles leave 16 / 24 / 24 heads.
A block that cuts a row holds that KV head too, a replica, whose weights and cache are counted;
each call beyond a rank's first costs `call_cost` bytes' worth of time. Pure, no MLX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

Rect = tuple[tuple[int, int], tuple[int, int]]  # (KV rows, columns), each [start, end)
Blocks = tuple[Rect, ...]  # one rank's attention: one uniform GQA call per rectangle


@dataclass(frozen=True)
class HeadGrid:
    """What attention looks like to the splitter; the same numbers on the planner and a rank."""

    heads: int  # query heads
    kv_heads: int  # KV heads (1 for MLA: its latent cache is whole on every rank)
    out_dim: int  # columns of the output projection per head (head_dim; MLA: v_head_dim)
    group_size: int | None  # quantization group along the output projection's input, or None
    q_cost: float = 1.0  # bytes read per query head (its q and o projections)
    kv_cost: float = 1.0  # bytes read per KV head held (k, v projections and its cache)
    call_cost: float = 0.0  # an extra attention call on a layer, in bytes read in that time
    # Step-3.5: its sliding layers' heads when their counts differ, shared out on their own
    # (RankShare.other); None: every attention layer has these heads
    other: HeadGrid | None = None

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
        return all(self.starts_group(s) for s in starts)

    def starts_group(self, head: int) -> bool:
        """Does this head's first output-projection column start a quantization group?"""
        return not self.group_size or head * self.out_dim % self.group_size == 0

    def cost(self, blocks: Blocks) -> float:
        """Bytes (and bytes' worth of extra calls) one rank's blocks read per layer."""
        total = (len(blocks) - 1) * self.call_cost
        for (r0, r1), (c0, c1) in blocks:
            total += (r1 - r0) * ((c1 - c0) * self.q_cost + self.kv_cost)
        return total


@dataclass(frozen=True)
class Tiling:
    slowest: float  # the largest cost over weight of its ranks
    fastest: float
    kv: int  # KV heads held, replicas counted
    ranks: tuple[Blocks, ...]

    @property
    def key(self) -> tuple[float, float, int, int]:
        """Fastest first, then the most even (an idle rank's time cannot move to another
        phase), then the fewest KV heads, then the fewest calls. 9 significant digits: equal
        costs summed in another order still tie."""
        calls = sum(len(b) for b in self.ranks)
        return float(f"{self.slowest:.9g}"), self.slowest - self.fastest, self.kv, calls


def tile_heads(grid: HeadGrid, weights: Sequence[float]) -> list[Blocks] | None:
    """Each rank's blocks, in rank order, minimising the slowest rank's attention time (its
    cost over its weight); None when the heads cannot be split that many ways."""
    if grid.heads < len(weights):
        return None
    w = tuple(float(x) for x in weights)
    found = [t for t in (_guillotine(grid, w), _runs(grid, w)) if t is not None]
    return list(min(found, key=lambda t: t.key).ranks) if found else None


def _guillotine(grid: HeadGrid, w: tuple[float, ...]) -> Tiling | None:
    """One rectangle per rank by recursive cuts across rows or columns."""
    # Cuts a little off the proportional one let quantized heads align; with many ranks or
    # heads (beyond any real model) only the proportional cuts are tried, to stay fast.
    spread = 2 if grid.heads <= 256 else 0

    @cache
    def best(rect: Rect, lo: int, hi: int) -> Tiling | None:
        """The best tiling of `rect` for ranks lo..hi-1."""
        (r0, r1), (c0, c1) = rect
        if hi - lo == 1:
            if not grid.aligned(rect[0], rect[1]):
                return None
            c = grid.cost((rect,)) / w[lo]
            return Tiling(c, c, r1 - r0, ((rect,),))
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
                        one.ranks + two.ranks,
                    )
                    if found is None or got.key < found.key:
                        found = got
                    if hi - lo > 8:
                        return found
        return found

    return best(((0, grid.kv_heads), (0, grid.group)), 0, len(w))


def _cuts(a: int, b: int, frac: float, spread: int) -> list[int]:
    """Cut positions near the proportional one: a few either side, so alignment can be met."""
    target = a + (b - a) * frac
    near = range(math.floor(target) - spread, math.ceil(target) + spread + 1)
    return [c for c in near if a < c < b]


def run_blocks(start: int, end: int, group: int) -> Blocks:
    """Heads [start, end) in row order as rectangles: a row's tail, whole rows, a row's head."""
    blocks: list[Rect] = []
    row, col = divmod(start, group)
    if col:
        stop = min(end, (row + 1) * group)
        blocks.append(((row, row + 1), (col, stop - row * group)))
        start = stop
    whole = (end - start) // group
    if whole:
        blocks.append(((start // group, start // group + whole), (0, group)))
        start += whole * group
    if start < end:
        blocks.append(((start // group, start // group + 1), (0, end - start)))
    return tuple(blocks)


def _runs(grid: HeadGrid, w: tuple[float, ...]) -> Tiling | None:
    """Contiguous runs of heads in row order, one per rank: the slowest rank's time is
    minimised exactly, then the fastest rank's maximised under it (two passes of dynamic
    programming over the cut positions)."""
    group, n = grid.group, len(w)
    if grid.kv_heads == 1 or group == 1 or grid.heads > 512:
        return None  # runs are rectangles already (or a grid no model has)
    cuts = [h for h in range(grid.heads + 1) if grid.starts_group(h)]

    @cache
    def cost(start: int, end: int, rank: int) -> float:
        return grid.cost(run_blocks(start, end, group)) / w[rank]

    def solve(limit: float | None) -> tuple[float, list[int]] | None:
        """Without a limit: the least possible slowest time. With one: the largest possible
        fastest time while no rank exceeds the limit. Returns the value and the cuts."""
        inf = math.inf
        # value[e]: best over the ranks so far covering heads [0, e); back[r][e]: its last cut
        value = {0: inf if limit is not None else 0.0}
        back: list[dict[int, int]] = []
        for rank in range(n):
            nxt: dict[int, float] = {}
            came: dict[int, int] = {}
            for end in cuts:
                for start, before in value.items():
                    if start >= end:
                        continue
                    c = cost(start, end, rank)
                    if limit is None:
                        v = max(before, c)
                        better = end not in nxt or v < nxt[end]
                    else:
                        if c > limit:
                            continue
                        v = min(before, c)
                        better = end not in nxt or v > nxt[end]
                    if better:
                        nxt[end], came[end] = v, start
            value = nxt
            back.append(came)
        if grid.heads not in value:
            return None
        ends, end = [], grid.heads
        for rank in reversed(range(n)):
            ends.append(end)
            end = back[rank][end]
        return value[grid.heads], [0, *reversed(ends)]

    least = solve(None)
    if least is None:
        return None
    evened = solve(least[0] * (1 + 1e-9))
    assert evened is not None  # the first pass's cuts meet its own limit
    bounds = evened[1]
    ranks = tuple(run_blocks(bounds[i], bounds[i + 1], group) for i in range(n))
    times = [cost(bounds[i], bounds[i + 1], i) for i in range(n)]
    kv = sum(r1 - r0 for blocks in ranks for (r0, r1), _ in blocks)
    return Tiling(max(times), min(times), kv, ranks)
