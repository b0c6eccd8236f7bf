#!/usr/bin/env python3
"""Decode speed over 1..N ranks on this machine, for the README's benchmark section.

    .venv/bin/python scripts/bench_scaling.py [--local 2] [--out bench-results] [--calibrate]
        [--model DIR_OR_HF_ID | --layers 8 --hidden 512] [-p 256] [-g 128] [--trials 3]

Without --model it builds a tiny-but-real random-weight llama offline (8 layers, hidden 512,
8 heads / 4 KV heads: splits over 2 and 4 ranks). It runs `mlx-cluster bench --local N` and
leaves bench.json, bench.png and bench.md (machine line + markdown table) in --out.
--calibrate measures the links and memory first and saves them where `plan`/`launch` read them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "mlx-cluster"
TIMEOUT_S = 3600


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local", type=int, default=2, help="ranks on this machine (max size)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    ap.add_argument("--model", help="a model folder or Hugging Face id instead of the tiny one")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("-p", "--prompt-tokens", type=int, default=256)
    ap.add_argument("-g", "--gen-tokens", type=int, default=128)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--calibrate", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        model = args.model
        if model is None:
            model = str(Path(tmp) / "tiny")
            made = subprocess.run(
                [str(CLI), "tiny-model", model, "--layers", str(args.layers),
                 "--hidden", str(args.hidden), "--heads", "8", "--kv-heads", "4"],
                timeout=600,
            )  # fmt: skip
            if made.returncode != 0:
                return made.returncode
        argv = [
            str(CLI), "bench", "--local", str(args.local), "--model", model,
            "-p", str(args.prompt_tokens), "-g", str(args.gen_tokens),
            "--trials", str(args.trials),
            "--json", str(args.out / "bench.json"), "--plot", str(args.out / "bench.png"),
            *(["--calibrate"] if args.calibrate else []),
        ]  # fmt: skip
        print("$ " + " ".join(argv[1:]), file=sys.stderr)
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=TIMEOUT_S)
    sys.stdout.write(done.stdout)
    (args.out / "bench.md").write_text(done.stdout)
    print(f"wrote {args.out}/bench.json, bench.png, bench.md", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
