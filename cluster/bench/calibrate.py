"""Rank side of `mlx-cluster bench --calibrate` (job.mode "calibrate"): no model of the user's
is loaded.

Times all_sum on the group at a small, decode-sized message (one token's hidden state) and at a
large one, in the activations' dtype and on the default stream, as mlx-lm's sharded layers
call it, and what a tensor and a pipeline step cost beyond their compute (step_cost.py: a mini
model made in memory); then the ranks listed in `bandwidth_ranks` (one per machine: ranks
sharing a machine would share its bandwidth) time a reduction over a large array, i.e. reading
it once from memory. Rank 0 reports one "result" event; the launcher turns it into a
Calibration.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from cluster.bench.rates import FLOATS
from cluster.bench.step_cost import step_costs
from cluster.job import RankJob
from topology.errors import InputError

# Large enough that the read takes far longer than launching the reduction.
GPU_BANDWIDTH_BYTES, CPU_BANDWIDTH_BYTES = 1 << 30, 256 << 20


def _int(job: RankJob, name: str, default: int) -> int:
    value = job.options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"calibrate job option {name} must be a positive integer, got {value!r}")
    return value


def all_reduce_s(group: Any, size_bytes: int, repeats: int, dtype: mx.Dtype) -> float:
    """Median seconds of one all_sum of size_bytes (after a few untimed ones)."""
    x = mx.ones((max(1, size_bytes // dtype.size),), dtype=dtype)
    mx.eval(x)
    for _ in range(3):
        mx.eval(mx.distributed.all_sum(x, group=group))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(mx.distributed.all_sum(x, group=group))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_bandwidth_gbs(size_bytes: int, repeats: int) -> float:
    """GB/s of the fastest of `repeats` sums over a float32 array of size_bytes."""
    x = mx.random.uniform(shape=(max(1, size_bytes // 4),))
    mx.eval(x)
    mx.eval(x.sum())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(x.sum())
        best = min(best, time.perf_counter() - start)
    return x.nbytes / best / 1e9


def calibrate(job: RankJob, group: Any, emit: Callable[..., None]) -> None:
    from cluster.generate import barrier, gather_per_rank

    small = _int(job, "small_bytes", 16384)
    large = _int(job, "large_bytes", 32 << 20)
    dtype = FLOATS.get(str(job.options.get("dtype", "bfloat16")))
    if dtype is None:
        raise InputError(f"calibrate job option dtype must be one of {', '.join(FLOATS)}")
    measure = job.options.get("bandwidth_ranks", list(range(job.world_size)))
    if not isinstance(measure, list) or not all(isinstance(r, int) for r in measure):
        raise InputError("calibrate job option bandwidth_ranks must be a list of ranks")
    links: dict[str, Any] = {}
    if group is not None:
        emit("progress", stage="calibrate", step="all_reduce", bytes=small)
        links["small_s"] = all_reduce_s(group, small, _int(job, "small_repeats", 50), dtype)
        emit("progress", stage="calibrate", step="all_reduce", bytes=large)
        links["large_s"] = all_reduce_s(group, large, _int(job, "large_repeats", 5), dtype)
        emit("progress", stage="calibrate", step="step_costs")
        links |= step_costs(group, dtype)
    emit("progress", stage="calibrate", step="memory_bandwidth")
    gbs = 0.0
    if job.rank in measure:
        gpu = mx.metal.is_available()
        size = _int(job, "bandwidth_bytes", GPU_BANDWIDTH_BYTES if gpu else CPU_BANDWIDTH_BYTES)
        gbs = memory_bandwidth_gbs(size, _int(job, "bandwidth_repeats", 5))
    bandwidths = [float(v) for v in gather_per_rank(gbs, group, mx.float32)]
    if job.rank == 0:
        emit(
            "result",
            backend=job.backend,
            ranks=job.world_size,
            small_bytes=small,
            large_bytes=large,
            memory_bandwidth_gbs=[b if r in measure else None for r, b in enumerate(bandwidths)],
            **links,
        )
    barrier(group)
