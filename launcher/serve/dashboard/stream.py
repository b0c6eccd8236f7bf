"""GET /v1/cluster/stream: the state object as server-sent events — a `state` event whenever it
changed, checked every second, and a comment now and then so proxies keep the connection.
Every open stream reads the same build (DashboardState reuses one for half a second), so many
open pages cost about one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

TICK_S = 1.0
KEEPALIVE_S = 15.0


def _frame(state: dict[str, Any]) -> tuple[str, bytes]:
    # Everything but the clock decides whether something changed.
    changed = json.dumps({k: v for k, v in state.items() if k != "time"}, sort_keys=True)
    data = json.dumps(state, separators=(",", ":"))
    return changed, f"event: state\ndata: {data}\n\n".encode()


async def state_events(
    current: Callable[[], dict[str, Any]], tick_s: float = TICK_S
) -> AsyncIterator[bytes]:
    """The SSE body: the state at once, then each change; ends when the client goes (Starlette
    cancels the generator)."""
    last, quiet = "", 0.0
    yield b"retry: 2000\n\n"
    while True:
        key, frame = _frame(current())
        if key != last:
            last, quiet = key, 0.0
            yield frame
        else:
            quiet += tick_s
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield b": keep-alive\n\n"
        await asyncio.sleep(tick_s)
