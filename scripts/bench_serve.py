#!/usr/bin/env python3
"""`mlx-cluster serve` next to mlx-lm's own server: same model, same 2 ranks, one run.

    .venv/bin/python scripts/bench_serve.py [--reps 3] [--concurrency 1 4 8 16] [--per-client 2]
        [--max-tokens 48] [--prefix-tokens 1000] [--conversations 2] [--one-at-a-time]
        [--layers 8 --hidden 512 --heads 8 --kv-heads 4] [--dashboard-cost] [--dashboard-ab]
        [--json PATH] [--cli MLX_CLUSTER]

A tiny-but-real random-weight llama is built offline (8 layers, hidden 512, 8 heads / 4 KV heads).
Both servers run on 2 local ranks, tensor parallel, ring backend over 127.0.0.1:
  ours:   `mlx-cluster serve --local 2 --model DIR --port 0` (its default flags)
  mlx-lm: two `python -m mlx_lm.server` ranks started directly with MLX_RANK / MLX_HOSTFILE (not
          through mlx.launch, whose I/O loop spins on a core); rank 0 serves HTTP; its defaults
          (tensor parallel, --decode-concurrency 32, --prompt-concurrency 8); with the BLAS ours
          preload (the system OpenBLAS, cores split between the ranks) unless --their-blas
          bundled (the wheel's reference BLAS, mlx-lm out of the box on Linux).
By default both stay up for the whole run and every round is interleaved: per repetition, per
concurrency c, ours then mlx-lm (the order alternates each repetition). An idle server's ranks
spin in a collective, though (each takes a core), so on a machine with few cores a round shares
the CPU with the other, idle server; --one-at-a-time instead starts one server per repetition,
runs all its rounds, stops it, then does the same for the other (a reload per server and
repetition, the order still alternating). Each start is followed by an unrecorded warm-up.
A round: c clients at once, each sending --per-client streamed chat completions one after the
other (temperature 0, --max-tokens), every prompt fresh (a serial number and random words first;
the same prompts go to both servers), through the official `openai` client with its default 2
retries (counted by cause; a request still refused with 429 is counted as rejected). Per
request: time to the first content chunk (TTFT), the gaps between content chunks (ITL), the
time per output token after the first (TPOT: first to last content chunk / (tokens - 1); a
chunk can carry several tokens, as servers hold back tokens that end mid UTF-8 character) and the
completion tokens from the stream's usage chunk (`stream_options.include_usage`; content chunks
are counted only if a server sends no usage, and the notes say so). Aggregate tok/s = completion
tokens of the round / its wall time. Random weights may end a reply early, so the table also
gives the mean completion tokens per request.
Multi-turn: a system message of >= --prefix-tokens tokens (varied sentences, counted with the
model's tokenizer, fresh text each repetition) and a question (turn 1: a cache miss), then all of
it again with the answer and a second question (turn 2: a server that keeps the prefix answers
sooner); --conversations of them per repetition, one client.
Prints a markdown table (medians over repetitions of each round's figures; ours, mlx-lm, ratio
ours/mlx-lm: above 1 is better for tok/s, below 1 for latencies) and the machine line; --json
PATH keeps every request's figures too. A failure (a server exits, errs or stalls) ends the run
with the servers' log tails and the partial figures. Every server process is stopped at the end,
also on Ctrl-C, SIGTERM or an error. New kinds of rounds (e.g. `response_format` json_schema):
add a RoundKind to ROUND_KINDS; run_round() takes the request kwargs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serve_bench.main import run
from serve_bench.servers import CLI
from serve_bench.workloads import ANSWER_SCHEMA  # scripts/bench_mask.py times the same schema

__all__ = ["ANSWER_SCHEMA", "main", "parse_args"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--per-client", type=int, default=2, help="requests each client sends in turn")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=1000, help="multi-turn system message")
    p.add_argument("--conversations", type=int, default=2, help="multi-turn cases per rep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-retries", type=int, default=2, help="the openai client's (default 2)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds to get ready")
    p.add_argument("--request-timeout", type=float, default=120.0, help="openai client timeout")
    p.add_argument("--round-timeout", type=float, default=600.0)
    p.add_argument("--idle-probe", type=float, default=2.0, help="seconds of idle CPU probe")
    p.add_argument("--cli", default=CLI, help="the mlx-cluster executable (default: the venv's)")
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="per repetition, start one server, run all its rounds, stop it, then the other\n"
        "(an idle server's ranks spin in a collective; on a few-core machine that slows the\n"
        "other one down; this costs a reload per server and repetition)",
    )
    p.add_argument(
        "--dashboard-cost",
        action="store_true",
        help="instead of the comparison: the serve process's CPU with 0, 1 and 10 dashboard\n"
        "streams open (idle, interleaved, --reps times, 20 s each)",
    )
    p.add_argument(
        "--dashboard-ab",
        action="store_true",
        help="instead of the comparison: our server alone, per rep and concurrency three\n"
        "rounds, one with a dashboard stream open, two without (an A/A noise reference);\n"
        "prints the ratios with / without and without / without",
    )
    p.add_argument(
        "--their-blas",
        choices=["same", "bundled"],
        default="same",
        help="mlx-lm's ranks: same (default): the system OpenBLAS ours preload, the cores split\n"
        "alike; bundled: the wheel's reference BLAS, as mlx-lm runs out of the box",
    )
    p.add_argument(
        "--their-cores",
        choices=["free", "own"],
        default="free",
        help="mlx-lm's ranks: free (default): wherever the kernel runs them, as mlx-lm does;\n"
        "own: each kept to a block of cores of its own, as ours keep themselves on Linux\n"
        "(cluster/host_cores.py): a control that gives both sides the same placement",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write raw and summary figures")
    args = p.parse_args()
    if args.reps < 1 or args.per_client < 1 or min(args.concurrency) < 1:
        p.error("--reps, --per-client and --concurrency must be at least 1")
    return args


def main() -> int:
    return run(parse_args())


if __name__ == "__main__":
    sys.exit(main())
