"""--dashboard-cost: what open dashboards cost the serve process itself, in CPU — a figure the
shared machine's noise cannot blur the way it blurs tokens/s. One `serve --local 2`, idle;
per repetition, 0, 1 and 10 open /v1/cluster/stream clients in turn (interleaved), the serve
process's CPU seconds per wall second measured over each window; medians printed."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .dashboard import DashboardClient
from .procs import Proc, cpu_seconds, stop_procs
from .servers import start_ours, wait_ours
from .text import progress

STREAMS = (0, 1, 10)


def measure(cli: str, model: Path, logs: Path, seconds: float, reps: int) -> dict[int, float]:
    """Median share of a core the serve (launcher) process uses with n streams open."""
    procs: list[Proc] = []
    shares: dict[int, list[float]] = {n: [] for n in STREAMS}
    try:
        server = wait_ours(start_ours(cli, model, logs, procs), model, 300.0)
        pid = procs[0].popen.pid  # the launcher: HTTP, the state builds (ranks are apart)
        time.sleep(5)  # past the start's own work
        for rep in range(reps):
            for n in STREAMS:
                clients = [DashboardClient(server.base_url, quiet=True) for _ in range(n)]
                time.sleep(1)
                before, began = cpu_seconds([pid]), time.monotonic()
                time.sleep(seconds)
                after, took = cpu_seconds([pid]), time.monotonic() - began
                events = sum(c.events for c in clients)
                for c in clients:
                    c.close()
                assert before is not None and after is not None, "needs Linux /proc"
                share = (after - before) / took
                shares[n].append(share)
                progress(
                    f"rep {rep + 1} streams {n:2d}: serve process {100 * share:.2f}% of a core "
                    f"({events} state events)"
                )
    finally:
        stop_procs(procs)
    return {n: statistics.median(xs) for n, xs in shares.items()}
