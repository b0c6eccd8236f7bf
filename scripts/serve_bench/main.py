"""One run of bench_serve.py, end to end: build the tiny model, run the Bench, stop every server
process (also on Ctrl-C, SIGTERM or an error), print the report, write --json."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .procs import Proc, stop_procs
from .report import machine, machine_line, notes, summarize, table, to_json
from .runner import Bench
from .servers import RANKS, ROOT, BenchError
from .workloads import WORKLOADS


def _terminate(signum: int, _frame: Any) -> None:
    print(f"bench_serve: signal {signum}; stopping the servers", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the servers


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    sys.path.insert(0, str(ROOT))
    from tokenizers import Tokenizer

    from cluster.tiny_model import write_tiny_model

    options = vars(args).items()
    settings = {k: v if isinstance(v, int | float | list) else str(v) for k, v in options}
    info: dict[str, Any] = {"machine": machine(), "args": settings}
    began = time.monotonic()
    procs: list[Proc] = []
    failure = None
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        logs = Path(tmp)
        model = write_tiny_model(
            logs / "model", layers=args.layers, hidden=args.hidden, heads=args.heads,
            kv_heads=args.kv_heads, vocab=384,
        )  # fmt: skip
        if args.dashboard_cost:
            return _dashboard_cost(args, model, logs)
        if args.dashboard_ab:
            return _dashboard_ab(args, model, logs)
        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        bench = Bench(args, model, logs, procs, tokenizer, WORKLOADS)
        try:
            asyncio.run(bench.run())
        except BenchError as e:
            failure = str(e)
        except KeyboardInterrupt:
            print("bench_serve: interrupted; stopping the servers", file=sys.stderr)
            return 130
        finally:
            stop_procs(procs)
    results = bench.results
    summary = summarize(results, WORKLOADS, args)
    info["seconds"] = took = time.monotonic() - began
    mode = "one server up at a time" if args.one_at_a_time else "both servers up all run"
    print(
        f"\nmodel: random-weight llama, {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} heads / {args.kv_heads} KV heads; {RANKS} ranks, tensor parallel, ring "
        f"over 127.0.0.1; {args.reps} reps ({mode}); {args.per_client} streamed requests per "
        f"client in turn, max_tokens {args.max_tokens}, temperature 0"
    )
    print(f"machine: {machine_line(info['machine'])}\n")
    print("\n".join(table(summary, WORKLOADS, args)))
    for note in notes(summary, results, args):
        print(f"- {note}")
    print(f"\n(run took {took:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(to_json(results, summary, info, failure), indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    if failure:
        print(f"\nbench_serve: error (figures above are partial): {failure}", file=sys.stderr)
        return 1
    return 0


def _dashboard_cost(args: argparse.Namespace, model: Path, logs: Path) -> int:
    from .dashboard_cost import measure

    shares = measure(args.cli, model, logs, seconds=20.0, reps=args.reps)
    print("\n| dashboards open (/v1/cluster/stream clients) | serve process CPU, % of a core |")
    print("|---|---:|")
    for n, share in shares.items():
        print(f"| {n} | {100 * share:.2f} |")
    print(f"machine: {machine_line(machine())}")
    return 0


def _dashboard_ab(args: argparse.Namespace, model: Path, logs: Path) -> int:
    from .dashboard_ab import measure, table

    ratios = measure(args, model, logs)
    print(
        f"\nmodel: random-weight llama, {args.layers} layers, hidden {args.hidden}; {RANKS} ranks, "
        f"tensor parallel; {args.reps} reps; {args.per_client} streamed requests per client, "
        f"max_tokens {args.max_tokens}; medians (min–max) over reps of per-rep ratios"
    )
    print("\n".join(table(ratios)))
    events = [e for r in ratios.values() for e in r.events]
    print(f"dashboard state events read per round with it open: {min(events)}–{max(events)}")
    print(f"machine: {machine_line(machine())}")
    return 0
