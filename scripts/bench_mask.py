"""Where a constrained request's token mask should be made: on every rank, or on rank 0 and
shared. Sharing costs a collective of vocab/32 int32 words every step on top of making the mask
once; making it on every rank costs the mask time, in parallel, and nothing on the wire.

    .venv/bin/python scripts/bench_mask.py [--steps 300] [--vocab 152064]

Measures, on this machine: the mask time per step (llguidance, the tiny model's tokenizer, a
JSON schema with strings, numbers and enums), and the median all_sum latency of a mask-sized
message between 2 ranks over the ring backend on 127.0.0.1 (ranks started directly).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_serve import ANSWER_SCHEMA as SCHEMA  # noqa: E402  (the schema bench_serve times)

RANK = """
import os, sys, time, statistics
import mlx.core as mx
g = mx.distributed.init(backend="ring", strict=True)
x = mx.ones((int(sys.argv[1]),), dtype=mx.int32)
times = []
for i in range(int(sys.argv[2]) + 20):
    t = time.perf_counter()
    mx.eval(mx.distributed.all_sum(x, group=g, stream=mx.cpu))
    if i >= 20:
        times.append(time.perf_counter() - t)
if g.rank() == 0:
    print(statistics.median(times))
"""


def mask_time(steps: int) -> tuple[float, int]:
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load

    from cluster.serve.constraints import GrammarProcessor, json_grammar
    from cluster.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_model(Path(tmp) / "m", layers=1, hidden=64)
        _, tokenizer = load(str(model_dir))
    vocab = len(tokenizer.get_vocab())
    rng = np.random.default_rng(0)
    times, tokens = [], mx.array([0])
    proc = GrammarProcessor(json_grammar(SCHEMA), tokenizer)
    for _ in range(steps):
        t = time.perf_counter()
        logits = proc(tokens, mx.zeros((1, vocab)))
        mx.eval(logits)
        times.append(time.perf_counter() - t)
        allowed = np.flatnonzero(np.asarray(logits[0]) > -np.inf)
        if proc.matcher.is_stopped() or not len(allowed):
            proc = GrammarProcessor(json_grammar(SCHEMA), tokenizer)  # a fresh object
            tokens = mx.array([0])
            continue
        tokens = mx.array([int(rng.choice(allowed))])
    return statistics.median(times), vocab


def share_time(vocab: int, steps: int) -> float:
    words = -(-vocab // 32)
    with tempfile.TemporaryDirectory() as tmp:
        ports = []
        import socket

        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        hostfile = Path(tmp) / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ports]))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RANK, str(words), str(steps)],
                env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)},
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]
        out = [p.communicate(timeout=300)[0] for p in procs]
    return float(out[0].strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--vocab", type=int, default=152064, help="mask size to share")
    args = parser.parse_args()
    mask_s, tiny_vocab = mask_time(args.steps)
    share_s = share_time(args.vocab, args.steps)
    print("| step cost | median µs |")
    print("|---|---:|")
    print(f"| make the mask on every rank (llguidance, vocab {tiny_vocab}) | {mask_s * 1e6:.0f} |")
    print(
        f"| share a {args.vocab}-token mask from rank 0 (all_sum, 2 ranks) | {share_s * 1e6:.0f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
