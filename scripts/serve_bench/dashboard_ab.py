"""--dashboard-ab: does an open dashboard slow serving down? One `serve --local 2` under load;
per repetition and concurrency c, three rounds of fresh prompts: two without a dashboard and one
with a dashboard open (a /v1/cluster/stream client reading every state event, as the page does),
the dashboard's place among the three rotating each repetition. Per repetition it takes the ratio
with / without (the mean of the two rounds without) and, as the noise that ratio must stay within,
the ratio of the two rounds without each other (an A/A comparison under the same load)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .client import count_retries, open_client, run_round
from .dashboard import DashboardClient
from .procs import Proc, stop_procs
from .prompts import Prompts, user
from .servers import Server, start_ours, wait_ours
from .stats import RoundResult
from .text import progress

METRICS = (("tok_s", "aggregate tok/s"), ("itl_p50", "ITL p50"), ("itl_p99", "ITL p99"),
           ("ttft_p50", "TTFT p50"))  # fmt: skip
ORDERS = (("off", "on", "off"), ("on", "off", "off"), ("off", "off", "on"))


@dataclass
class Ratios:
    """Per repetition, for one concurrency: with / without, and without / without."""

    ab: dict[str, list[float]]
    aa: dict[str, list[float]]
    events: list[int]  # state events the open dashboard read, per repetition


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


async def _round(server: Server, client: Any, prompts: Prompts, c: int,
                 args: argparse.Namespace, rep: int) -> RoundResult:  # fmt: skip
    convs = [[[user(prompts.question())] for _ in range(args.per_client)] for _ in range(c)]
    return await run_round(
        client, server, convs, args.max_tokens, {}, args.round_timeout, kind="ab", rep=rep
    )


async def _run(server: Server, args: argparse.Namespace) -> dict[int, Ratios]:
    prompts = Prompts(args.seed)
    client = open_client(server, args.request_timeout, args.max_retries)
    out = {c: Ratios({m: [] for m, _ in METRICS}, {m: [] for m, _ in METRICS}, [])
           for c in args.concurrency}  # fmt: skip
    try:
        for c in (1, 4):  # not recorded: compiles the batched paths
            await _round(server, client, prompts, c, args, -1)
        for rep in range(args.reps):
            for c in args.concurrency:
                offs: list[dict[str, Any]] = []
                on: dict[str, Any] = {}
                for mode in ORDERS[rep % len(ORDERS)]:
                    dash = DashboardClient(server.base_url, quiet=True) if mode == "on" else None
                    if dash is not None:
                        await asyncio.sleep(1.0)  # connected and past its first state event
                    result = (await _round(server, client, prompts, c, args, rep)).summary()
                    if dash is not None:
                        dash.close()
                        out[c].events.append(dash.events)
                        on = result
                    else:
                        offs.append(result)
                for m, _ in METRICS:
                    mean_off = statistics.mean(o[m] for o in offs if o[m] is not None)
                    if (ab := _ratio(on[m], mean_off)) is not None:
                        out[c].ab[m].append(ab)
                    if (aa := _ratio(offs[1][m], offs[0][m])) is not None:
                        out[c].aa[m].append(aa)
                ab_tok = out[c].ab["tok_s"][-1] if out[c].ab["tok_s"] else float("nan")
                progress(f"rep {rep + 1} c {c}: tok/s with / without a dashboard {ab_tok:.3f} "
                         f"({out[c].events[-1]} state events)")  # fmt: skip
    finally:
        await client.close()
    return out


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"


def table(ratios: dict[int, Ratios]) -> list[str]:
    """Medians (min–max) over repetitions; 'within noise' when the with/without median lies
    inside the range of the A/A ratios."""
    lines = [
        "| clients | figure | with / without a dashboard | without / without (noise) | "
        "within noise |",
        "|---:|---|---:|---:|---|",
    ]
    for c, r in ratios.items():
        for m, label in METRICS:
            ab, aa = r.ab[m], r.aa[m]
            inside = bool(ab and aa) and min(aa) <= statistics.median(ab) <= max(aa)
            lines.append(f"| {c} | {label} | {_spread(ab)} | {_spread(aa)} | "
                         f"{'yes' if inside else 'no'} |")  # fmt: skip
    return lines


def measure(args: argparse.Namespace, model: Path, logs: Path) -> dict[int, Ratios]:
    count_retries()
    procs: list[Proc] = []
    try:
        began = time.monotonic()
        server = wait_ours(start_ours(args.cli, model, logs, procs), model, args.start_timeout)
        progress(f"mlx-cluster ready at {server.base_url} ({time.monotonic() - began:.1f} s)")
        return asyncio.run(_run(server, args))
    finally:
        stop_procs(procs)
