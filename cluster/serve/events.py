"""What rank 0 tells the launcher about requests: their events, gathered into one line per step,
and `stats` for the launcher's /metrics."""

from __future__ import annotations

import time
from typing import Any

from cluster.generate import Emit
from cluster.serve.prefix_cache import PrefixCache
from cluster.speculative.check_width import StepCost

STATS_EVERY_S = 1.0


class LauncherEvents:
    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._out: list[dict[str, Any]] = []  # request events wait here for flush()
        self._last_stats = 0.0

    def emit(self, event: str, **fields: Any) -> None:
        self._out.append({"event": event, **fields})

    def flush(self) -> None:
        """This step's request events, as one line: a write and a parse per step, not per
        token and request."""
        out, self._out = self._out, []
        if len(out) == 1:
            self._emit(out[0].pop("event"), **out[0])
        elif out:
            self._emit("batch", events=out)

    def stats(
        self,
        running: int,
        queued: int,
        batch: int,
        cache: PrefixCache,
        kv_reserved: int = 0,
        drafting: tuple[int | None, StepCost | None] | None = None,
    ) -> None:
        """A `stats` event at most every STATS_EVERY_S; `kv_reserved`: the KV positions the
        memory budget holds for the running sequences; `drafting`: the draft width in use (None:
        the bound, costs not measured yet) and the fitted step cost."""
        now = time.monotonic()
        if now - self._last_stats < STATS_EVERY_S:
            return
        self._last_stats = now
        extra: dict[str, Any] = {}
        if drafting is not None:
            width, cost = drafting
            extra["draft_width"] = width
            if cost is not None:
                extra["step_cost_fixed_s"] = cost.fixed_s
                extra["step_cost_per_position_s"] = cost.per_position_s
                extra["step_cost_check_s"] = cost.check_s
                extra["step_cost_check_per_position_s"] = cost.check_slope
        self.emit(
            "stats",
            running=running,
            queued=queued,
            batch=batch,
            prefix_cache_bytes=cache.nbytes,
            prefix_cache_tokens=cache.tokens,
            prefix_cache_entries=len(cache),
            prefix_cache_hits=cache.hits,
            prefix_cache_lookups=cache.lookups,
            prefix_cache_limit_tokens=cache.limit,
            kv_reserved_tokens=kv_reserved,
            **extra,
        )
