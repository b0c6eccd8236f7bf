"""Decode speed of `mlx-cluster launch` next to mlx-lm's own, measured side by side.

    .venv/bin/python scripts/bench_runtime.py [--reps 5] [--tokens 128] [--layers 8 --hidden 512]

Two comparisons on one tiny-but-real random-weight model (built offline), repetitions
interleaved (ours, theirs, ours, theirs, ...) so load drifts hit both alike:
  1. `launch --local 1` vs plain mlx_lm.stream_generate in one process   (goal >= 0.97x)
  2. `launch --local 2 --strategy tensor` vs
     `mlx.launch -n 2 -- python -m mlx_lm benchmark` on the same ring backend (goal >= 0.95x)
  3. the same, against those mlx_lm benchmark ranks started directly without mlx.launch (a
     control: mlx.launch's I/O threads select() on the ranks' always-writable stdin and spin,
     which on a machine with few cores slows its ranks down)
Every mlx-lm process gets the BLAS our ranks preload (the system OpenBLAS, the cores split
between the ranks; none found: both keep the wheel's). Prints generation tok/s (median and best
over reps), the ratios, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python")
BIN = ROOT / ".venv" / "bin"
PROMPT = "Write a short poem about the sea, the wind and the mountains in the morning light"
TIMEOUT_S = 600


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if platform.system() == "Darwin":
        done = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True
        )
        cpu = done.stdout.strip() or cpu
    import mlx.core as mx

    device = "GPU (Metal)" if mx.metal.is_available() else "CPU"
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()}, MLX on {device}"


def same_blas(ranks: int) -> dict[str, str]:
    """The environment that gives mlx-lm's `ranks` processes the BLAS ours preload (the system
    OpenBLAS, the cores split between them): the engines compared, not the libraries."""
    from serve_bench.servers import same_blas_env

    return {**os.environ, **same_blas_env(ranks)}


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=env
    )
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-2000:]}")
    return done.stdout


Measured = tuple[float, int]  # generation tok/s, tokens generated


@dataclass(frozen=True)
class Row:
    name: str
    ours: float  # median generation tok/s
    ref: float
    ours_best: float
    ref_best: float
    goal: float  # ours / ref at least this


def ours(model: Path, ranks: int, tokens: int) -> Measured:
    out = _run([
        str(BIN / "mlx-cluster"), "launch", "--local", str(ranks), "--strategy", "tensor",
        "--model", str(model), "--prompt", PROMPT, "--max-tokens", str(tokens),
        "--ignore-chat-template", "--json",
    ])  # fmt: skip
    found = json.loads(out)
    return float(found["generation_tps"]), len(found["tokens"])


def plain_stream_generate(model: Path, tokens: int) -> Measured:
    argv = [PY, __file__, "--plain-reference", str(model), "--tokens", str(tokens)]
    out = _run(argv, same_blas(1))
    found = json.loads(out)
    return float(found["generation_tps"]), int(found["tokens"])


def mlx_lm_benchmark(model: Path, tokens: int) -> Measured:
    # mlx_lm.benchmark: random prompt ids, EOS disabled, a warm-up, then timed trials.
    out = _run([
        str(BIN / "mlx.launch"), "-n", "2", "--", PY, "-m", "mlx_lm", "benchmark",
        "--model", str(model), "-p", "32", "-g", str(tokens), "-n", "1",
    ], same_blas(2))  # fmt: skip
    found = re.search(r"Averages:.*generation_tps=([0-9.]+)", out)
    if found is None:
        sys.exit(f"no 'Averages:' line in mlx_lm benchmark output:\n{out[-2000:]}")
    return float(found.group(1)), tokens  # EOS is disabled there: always `tokens`


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mlx_lm_benchmark_direct(model: Path, tokens: int) -> Measured:
    """The same mlx_lm benchmark ranks started directly (MLX_RANK + MLX_HOSTFILE), no launcher:
    the control that separates the launcher's own cost from the ranks'."""
    with tempfile.TemporaryDirectory(prefix="bench-ring-") as tmp:
        hostfile = Path(tmp) / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in range(2)]))
        argv = [PY, "-m", "mlx_lm", "benchmark", "--model", str(model), "-p", "32"]
        argv += ["-g", str(tokens), "-n", "1"]
        procs = [
            subprocess.Popen(
                argv,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**same_blas(2), "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)},
            )
            for r in range(2)
        ]
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    found = re.search(r"Averages:.*generation_tps=([0-9.]+)", outs[0])
    if found is None:
        sys.exit(f"no 'Averages:' line in mlx_lm benchmark output:\n{outs[0][-2000:]}")
    return float(found.group(1)), tokens


def plain_reference(model: str, tokens: int) -> None:
    """Child process: plain mlx-lm, the same raw prompt, greedy; print generation tok/s."""
    from mlx_lm import load, stream_generate

    loaded = load(model)
    m, tok = loaded[0], loaded[1]
    last = None
    for response in stream_generate(m, tok, PROMPT, max_tokens=tokens):
        last = response
    assert last is not None
    print(json.dumps({"generation_tps": last.generation_tps, "tokens": last.generation_tokens}))


def compare(
    name: str, mine: Callable[[], Measured], theirs: Callable[[], Measured], reps: int, goal: float
) -> Row:
    a, b = [], []
    for i in range(reps):
        (ta, na), (tb, nb) = mine(), theirs()
        a.append(ta)
        b.append(tb)
        print(
            f"  {name} rep {i + 1}: ours {ta:.1f} tok/s ({na} tokens), "
            f"reference {tb:.1f} tok/s ({nb} tokens)",
            flush=True,
        )
    return Row(name, statistics.median(a), statistics.median(b), max(a), max(b), goal)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--plain-reference", metavar="MODEL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.plain_reference:
        plain_reference(args.plain_reference, args.tokens)
        return
    sys.path.insert(0, str(ROOT))
    from cluster.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        model = write_tiny_model(
            Path(tmp) / "model", layers=args.layers, hidden=args.hidden, heads=8, kv_heads=4,
            vocab=384,
        )  # fmt: skip
        print(f"model: llama, {args.layers} layers, hidden {args.hidden}; {args.tokens} tokens")
        rows = [
            compare(
                "1 rank vs stream_generate",
                lambda: ours(model, 1, args.tokens),
                lambda: plain_stream_generate(model, args.tokens),
                args.reps,
                0.97,
            ),
            compare(
                "2 ranks tensor vs mlx.launch -n 2 mlx_lm benchmark",
                lambda: ours(model, 2, args.tokens),
                lambda: mlx_lm_benchmark(model, args.tokens),
                args.reps,
                0.95,
            ),
            compare(
                "2 ranks tensor vs the same, started directly",
                lambda: ours(model, 2, args.tokens),
                lambda: mlx_lm_benchmark_direct(model, args.tokens),
                args.reps,
                0.95,
            ),
        ]
    print(f"\nmachine: {machine()}")
    print("generation tok/s; median over reps, and best (other load only ever slows a run down)")
    cols = ("ours", "ref", "ratio", "best", "ref", "ratio", "goal")
    print(f"{'comparison':<52} " + " ".join(f"{c:>7}" for c in cols))
    for r in rows:
        ratio, best = r.ours / r.ref, r.ours_best / r.ref_best
        mark = "ok" if ratio >= r.goal else "below"
        print(
            f"{r.name:<52} {r.ours:>7.1f} {r.ref:>7.1f} {ratio:>6.3f}x {r.ours_best:>7.1f} "
            f"{r.ref_best:>7.1f} {best:>6.3f}x {r.goal:>5.2f}x {mark}"
        )


if __name__ == "__main__":
    main()
