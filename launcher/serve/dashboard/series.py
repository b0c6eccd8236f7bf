"""The dashboard's small time series: one point a second, the last two minutes, taken only when
a dashboard asks (nobody watching costs nothing). Token rates are the counters' increases
between two points, so they are /metrics' own counters, differenced."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

POINTS = 120
EVERY_S = 1.0
RATES = {"prompt_tps": "prompt_tokens", "generation_tps": "generated_tokens"}


class Series:
    def __init__(self, points: int = POINTS, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self._t: deque[float] = deque(maxlen=points)
        self._values: dict[str, deque[float | None]] = {}
        self._last: tuple[float, dict[str, float]] | None = None  # when, the counters then
        self._rates: dict[str, float] = dict.fromkeys(RATES, 0.0)
        self._lock = threading.Lock()

    def sample(self, now: float, totals: dict[str, float], values: dict[str, float | None]) -> None:
        """A point from the counters (`totals`) and the figures (`values`), at most every
        every_s; a counter that went down (a restart of serve's state) counts from 0 again."""
        with self._lock:
            if self._last is not None and now - self._last[0] < self.every_s:
                return
            if self._last is not None:
                then, before = self._last
                for rate, counter in RATES.items():
                    grew = totals.get(counter, 0.0) - before.get(counter, 0.0)
                    self._rates[rate] = max(0.0, grew) / (now - then)
            self._last = (now, dict(totals))
            self._t.append(now)
            point: dict[str, float | None] = {**self._rates, **values}
            for key in point.keys() | self._values.keys():
                column = self._values.setdefault(key, deque(maxlen=self._t.maxlen))
                while len(column) < len(self._t) - 1:  # a figure that appeared late
                    column.append(None)
                column.append(point.get(key))  # None: gone (a rank of the last plan)

    def rates(self) -> dict[str, float]:
        with self._lock:
            return dict(self._rates)

    def to_json(self, now: float) -> dict[str, Any]:
        """Seconds before `now` per point, and each figure's column."""
        with self._lock:
            out: dict[str, Any] = {"ago_s": [round(now - t, 2) for t in self._t]}
            for key, column in self._values.items():
                out[key] = [None if v is None else round(v, 6) for v in column]
            return out
