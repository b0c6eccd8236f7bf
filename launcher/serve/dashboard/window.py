"""The last minute of one latency: p50/p99 for the dashboard, fed where ServeMetrics observes
the same sample for its histogram (a histogram's buckets are too coarse for a percentile, and it
never forgets; the dashboard asks about the last minute)."""

from __future__ import annotations

import threading
import time
from collections import deque

WINDOW_S = 60.0
MAX_SAMPLES = 8192  # a minute at ~136 tokens/s; older samples beyond it just drop early


class Window:
    """Timed samples of the last WINDOW_S seconds; thread-safe (supervisor threads add)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._samples)

    def add(self, value: float, now: float | None = None) -> None:
        at = time.monotonic() if now is None else now
        with self._lock:
            self._samples.append((at, value))
            # Forgotten here too, not only when a dashboard reads: unread, the window would hold
            # samples for as long as MAX_SAMPLES lasts (an hour of first-token times at 2/s).
            self._forget(at)

    def percentiles(self, now: float | None = None) -> dict[str, float | None]:
        """p50 and p99 (nearest rank) of the samples of the last window; None without any."""
        with self._lock:
            self._forget(time.monotonic() if now is None else now)
            values = sorted(v for _, v in self._samples)
        if not values:
            return {"p50": None, "p99": None, "count": 0}

        def rank(q: float) -> float:
            return values[min(len(values) - 1, max(0, int(q * len(values) + 0.999999) - 1))]

        return {"p50": rank(0.5), "p99": rank(0.99), "count": len(values)}

    def _forget(self, now: float) -> None:
        """Drop the samples older than the window (the lock is held)."""
        since = now - self.window_s
        while self._samples and self._samples[0][0] < since:
            self._samples.popleft()
