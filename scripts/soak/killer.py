"""The failover soak's rank killer: every M minutes SIGKILL one rank (rank 1, 2, … in turn, modulo
the ranks there are), then time /health going down and back up, and send a good request to see
serving resume. The window from the kill to that request's answer is when errors are expected."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

from .serve import Served, health

DOWN_WITHIN_S = 30.0  # serve turns /health 503 within 10 s of a lost rank (README: Failover)
UP_WITHIN_S = 300.0  # three ranks reloading on 2 shared cores take a while


@dataclass
class Kill:
    t: float  # on the soak's clock
    rank: int
    pid: int
    plan_before: str
    down_after_s: float | None = None  # /health no longer 200
    up_after_s: float | None = None  # /health 200 again
    resumed_after_s: float | None = None  # a good request answered
    plan_after: str = ""
    probe_error: str = ""

    @property
    def window_end(self) -> float:
        """Until when errors are expected: the probe's answer, or the end of the soak."""
        after = self.resumed_after_s if self.resumed_after_s is not None else 1e9
        return self.t + after

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _wait_health(root: str, ok: bool, timeout_s: float, start: float) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (health(root)[0] == 200) == ok:
            return time.monotonic() - start
        time.sleep(0.2)
    return None


async def _probe(client: Any, model: str, timeout_s: float) -> str:
    """Empty when a small chat request succeeds, else why not."""
    try:
        async with asyncio.timeout(timeout_s):
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
            )
    except TimeoutError:
        return "hang"
    except Exception as e:  # what the probe reports, not what stops the soak
        return f"{type(e).__name__}: {e}"[:300]
    return ""


async def kill_loop(
    served: Served, client: Any, model: str, t0: float, every_s: float, until: float,
    timeout_s: float, kills: list[Kill],
) -> None:  # fmt: skip
    """Kill at every_s, 2 every_s, … while a kill leaves a minute to recover before `until`."""
    n = 0
    while (at := (n + 1) * every_s) <= until - 60:
        await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))
        pids = served.rank_pids()
        status, body = health(served.root)
        if not pids:
            continue
        order = sorted(pids)
        rank = order[(n + 1) % len(order)]
        plan = f"{body.get('strategy', '?')} x{body.get('ranks', '?')}" if status == 200 else ""
        killed_at = time.monotonic()
        os.kill(pids[rank], signal.SIGKILL)
        kill = Kill(killed_at - t0, rank, pids[rank], plan)
        kills.append(kill)
        n += 1
        kill.down_after_s = await asyncio.to_thread(
            _wait_health, served.root, False, DOWN_WITHIN_S, killed_at
        )
        kill.up_after_s = await asyncio.to_thread(
            _wait_health, served.root, True, UP_WITHIN_S, killed_at
        )
        kill.probe_error = await _probe(client, model, timeout_s)
        if not kill.probe_error:
            kill.resumed_after_s = time.monotonic() - killed_at
        status, body = health(served.root)
        kill.plan_after = f"{body.get('strategy', '?')} x{body.get('ranks', '?')}"
