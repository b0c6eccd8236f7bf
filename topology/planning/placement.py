"""Where the weights go: what tensor parallel requires of the shapes, how pipeline splits layers,
and how much memory each rank needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topology.chips import GIB
from topology.host_rates import HostRates
from topology.model.spec import ModelSpec
from topology.planning.tensor_costs import RankCost

# Beyond weights and KV cache: prefill runs in 2048-token steps and the Metal allocator keeps a
# cache, so leave 1 GiB + 2% of the weights. A margin chosen here, not a measurement.
HEADROOM_BYTES = GIB
HEADROOM_FRACTION = 0.02


@dataclass(frozen=True)
class Slot:
    """One rank's place: a host (or a share of this machine for --local N)."""

    host: str
    ssh: str
    usable_bytes: int | None  # GPU-usable memory for this rank
    memory_bytes: int | None  # the machine's memory (for wired-limit suggestions)
    bandwidth_gbs: float
    ip: str | None = None
    # False for a non-Mac whose memory the probe cannot read: planned without a memory check.
    memory_checked: bool = True
    # True when usable_bytes is a wired limit someone set (too small for the weights: bad input).
    limit_given: bool = False
    rates: HostRates | None = None  # measured on the host (None: compute not modelled)
    ranks_here: int = 1  # the ranks that share this host's compute (--local N)
    computes_alone: bool = False  # the others wait while it computes (--local pipeline stages)

    def gflops(self, kind: str, rows: int) -> float | None:
        """This rank's matmul throughput at `rows` rows, when its host was measured."""
        if self.rates is None:
            return None
        together = not self.computes_alone
        return self.rates.shared_gflops(kind, rows, self.ranks_here, together)

    def crowding(self) -> tuple[float, float]:
        """(fair, whole) slowdown of this rank's work by the ranks sharing its host's cores."""
        if self.rates is None:
            return 1.0, 1.0
        return self.rates.crowding(self.ranks_here, not self.computes_alone)

    def layer_costs(self, kind: str) -> tuple[float, float] | None:
        """This rank's seconds of a layer's small ops and per exp-type element (a CPU's)."""
        if self.rates is None:
            return None
        return self.rates.layer_costs(kind, self.ranks_here, not self.computes_alone)


@dataclass(frozen=True)
class RankLoad:
    layers: tuple[int, int]  # [start, end): the layers this rank runs
    weight_bytes: int
    kv_cache_bytes: int
    read_bytes: float = 0.0  # tensor: what the rank reads per token

    @property
    def needed_bytes(self) -> int:
        return int(
            self.weight_bytes * (1 + HEADROOM_FRACTION) + HEADROOM_BYTES + self.kv_cache_bytes
        )


def tensor_loads(costs: Sequence[RankCost], layers: int) -> list[RankLoad]:
    """Each tensor rank's load: a share of every layer (its heads and widths)."""
    return [
        RankLoad((0, layers), int(c.weight_bytes), int(c.kv_cache_bytes), c.read_bytes)
        for c in costs
    ]


def pipeline_loads(spec: ModelSpec, split: Sequence[int], context: int) -> list[RankLoad]:
    """Loads for a split in rank order (rank 0 = the LAST layers, as mlx-lm orders them)."""
    costs = spec.layer_costs()
    loads = []
    for r, count in enumerate(split):
        start = sum(split[r + 1 :])
        end = start + count
        weights = sum(c.total for c in costs[start:end]) + spec.outside_layers_bytes
        kv = spec.cache_bytes(start, end, context)
        loads.append(RankLoad((start, end), int(weights), int(kv)))
    return loads


def _greedy(costs: list[float], caps: list[float]) -> list[int] | None:
    """Fill stages in layer order with as many layers as fit, leaving one for each later stage."""
    counts, i, n = [], 0, len(caps)
    for k, cap in enumerate(caps):
        last = k == n - 1
        take, used = 0, 0.0
        while i + take < len(costs) - (n - 1 - k) and (last or used + costs[i + take] <= cap):
            used += costs[i + take]
            take += 1
        if take == 0:
            return None
        counts.append(take)
        i += take
    return counts


def split_layers(spec: ModelSpec, slots: Sequence[Slot], context: int) -> list[int]:
    """Layers per rank in rank order, in proportion to each rank's free memory.

    Stages run in layer order from the last rank to rank 0. Every rank gets at least one layer.
    When rounding to whole layers overfills a rank, a greedy fill is tried instead.
    """
    n, total_layers = len(slots), spec.layers
    costs = [
        c.total * (1 + HEADROOM_FRACTION) + spec.layer_cache_bytes(i, context)
        for i, c in enumerate(spec.layer_costs())
    ]
    fixed = spec.outside_layers_bytes * (1 + HEADROOM_FRACTION) + HEADROOM_BYTES
    known = [s.usable_bytes - fixed for s in slots if s.usable_bytes is not None]
    guess = sum(known) / len(known) if known else 1.0  # unknown memory: like the others
    caps = [
        max(1.0, s.usable_bytes - fixed if s.usable_bytes is not None else guess)
        for s in reversed(slots)  # layer order
    ]
    counts, start, done_cost = [], 0, 0.0
    for k in range(n):
        target = sum(costs) * sum(caps[: k + 1]) / sum(caps)
        end = start
        while end < total_layers and done_cost + costs[end] / 2 < target:
            done_cost += costs[end]
            end += 1
        end = min(max(end, start + 1), total_layers - (n - 1 - k))
        if k == n - 1:
            end = total_layers
        done_cost = sum(costs[:end])
        counts.append(end - start)
        start = end
    if not _fits(counts, costs, caps):
        greedy = _greedy(costs, caps)
        if greedy and _fits(greedy, costs, caps):  # else keep the proportional split to report
            counts = greedy
    return list(reversed(counts))


def _fits(counts: list[int], costs: list[float], caps: list[float]) -> bool:
    start = 0
    for count, cap in zip(counts, caps, strict=True):
        if sum(costs[start : start + count]) > cap:
            return False
        start += count
    return True
