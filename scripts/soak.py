#!/usr/bin/env python3
"""A soak run of `mlx-cluster serve`: long mixed load, then a verdict on leaks and stability.

    .venv/bin/python scripts/soak.py [--minutes 30] [--local 2] [--clients 16]
        [--kill-every-min M] [--model DIR] [--json FILE] [--log FILE]

`serve --local N` on a tiny random-weight model (or --model DIR) gets --clients concurrent
loops through the official `openai` and `anthropic` clients: streamed and whole chat answers,
streams closed after a few chunks, `n` > 1, tool calls (`required` and `auto`), `response_format`
json_schema, seeded sampling at temperature > 0, seeded completions repeated, Anthropic
messages, nearly all behind one ~1,000-token system prompt (so the prefix cache works), and a
hostile body every --hostile-every-s seconds. Every request is bounded by --request-timeout; one
that runs past it is a hang. Every --sample-s seconds: each rank's RSS (/proc; its pid found by
an environment marker) and MLX active + cache memory (its heartbeat, through /metrics), the
prefix cache's size and bound, /health.

The verdict (Markdown table on stdout, JSON with --json; exit 0 only if every criterion passes):
no good request fails; every hostile body gets a 4xx; each rank's RSS and MLX memory grow by at
most 5 % after the first W minutes; ITL p99 (client side, gaps between streamed chunks) of the
last W minutes is at most 1.2x the first W's; the prefix cache stays within its budget; no
"Traceback" in serve's log. W = min(5, minutes / 4): the issue's 5 minutes for a 30-minute run,
scaled down for short ones (details: soak/verdict.py).

--kill-every-min M (the failover soak, e.g. --local 3 --kill-every-min 5): SIGKILL one rank
every M minutes; then every request open at a kill must end with an error within 30 s (never
hang), /health must go down and come back, a request must succeed after it, serve must count
the failover, and memory must not grow across re-plans of the same shape; errors inside a
kill's window (the kill to the first answer after it) are expected, not failures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from soak.main import run


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--local", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument(
        "--kill-every-min", type=float, default=None, metavar="M",
        help="SIGKILL a rank every M minutes (default: never)",
    )  # fmt: skip
    p.add_argument("--model", type=Path, help="a model folder (default: a tiny random model)")
    p.add_argument("--json", type=Path, metavar="FILE", help="verdict, samples and requests")
    p.add_argument("--log", type=Path, metavar="FILE", help="write serve's stderr here")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="the shared system prompt")
    p.add_argument(
        "--prefix-cache-gb", type=float, default=0.25,
        help="serve's --prefix-cache-gb (default 0.25: the load fills it within the first\n"
        "minute, so memory is steady after W and the cache's bound is exercised)",
    )  # fmt: skip
    p.add_argument("--sample-s", type=float, default=5.0, help="memory sampling period")
    p.add_argument("--hostile-every-s", type=float, default=10.0)
    p.add_argument("--request-timeout", type=float, default=180.0, help="a longer one is a hang")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--serve-arg", action="append", metavar="ARG",
        help="one more argument for serve (repeat; e.g. --serve-arg=--no-rejoin)",
    )  # fmt: skip
    args = p.parse_args()
    if args.minutes <= 0 or args.clients < 1 or args.local < 1:
        p.error("--minutes, --clients and --local must be positive")
    if args.kill_every_min is not None and args.local < 2:
        p.error("--kill-every-min needs --local 2 or more (a lost last rank is only restarted)")
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
