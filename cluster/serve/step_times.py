"""This rank's own decoding step times, kept for its heartbeat (cluster/rank.py): serve's
dashboard and /metrics show each rank's step as that rank measured it, not rank 0's for all."""

from __future__ import annotations

import statistics
import threading

MAX_KEPT = 512  # a heartbeat's worth of steps at any speed; older ones say nothing new

_lock = threading.Lock()
_recent: list[float] = []


def record(seconds: float) -> None:
    """One step of the batch (engine.next()), on this rank."""
    with _lock:
        _recent.append(seconds)
        del _recent[:-MAX_KEPT]


def take() -> float | None:
    """The median step since the last take (None when the rank has not stepped since)."""
    with _lock:
        steps = _recent[:]
        _recent.clear()
    return statistics.median(steps) if steps else None
