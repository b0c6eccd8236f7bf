"""The servers one group compares, each up for the whole group: ours with its defaults (drafts
on), ours with --speculative off, and, on one rank, mlx-lm's own server on the same BLAS."""

from __future__ import annotations

import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from serve_bench.procs import Proc, free_port, start_proc, stop_procs
from serve_bench.servers import BIN, CLI, PY, BenchError, same_blas_env

from spec_bench import ring_wait

READY = re.compile(r"mlx-cluster: serving .* at (http://\S+/v1)")


@dataclass(frozen=True)
class Spec:
    label: str  # "ours", "ours-off" or "mlx-lm"
    ranks: int
    strategy: str


@dataclass
class Running:
    spec: Spec
    base_url: str
    model: str
    procs: list[Proc]


def groups(names: list[str]) -> dict[str, list[Spec]]:
    """The groups asked for: each compares its servers with the same prompts, interleaved."""
    known = {
        "1": [Spec("ours", 1, "tensor"), Spec("ours-off", 1, "tensor"), Spec("mlx-lm", 1, "")],
        "tp2": [Spec("ours", 2, "tensor"), Spec("ours-off", 2, "tensor")],
        "pp2": [Spec("ours", 2, "pipeline"), Spec("ours-off", 2, "pipeline")],
        "tp3": [Spec("ours", 3, "tensor"), Spec("ours-off", 3, "tensor")],
    }
    return {n: known[n] for n in names}


def start(spec: Spec, model: Path, logs: Path, timeout: float) -> Running:
    if spec.label == "mlx-lm":
        return _mlx_lm(spec, model, logs, timeout)
    argv = [CLI, "serve", "--local", str(spec.ranks), "--strategy", spec.strategy]
    argv += ["--model", str(model), "--port", "0"]
    if spec.label == "ours-off":
        argv += ["--speculative", "off"]
    env = ring_wait.env(spec.ranks, logs)
    if env:
        print(
            f"{spec.label}: {spec.ranks} ranks on {ring_wait.cores()} cores: ring-wait shim "
            f"preloaded (scripts/spec_bench/ring_wait.py)",
            file=sys.stderr,
            flush=True,
        )
    proc = start_proc(f"{spec.label}-{spec.strategy}{spec.ranks}", argv, logs, env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = READY.search(proc.out.read_text(errors="replace"))
        if found:
            proc.remember_children()
            return Running(spec, found.group(1), str(model), [proc])
        if not proc.running:
            raise BenchError(f"{spec.label} exited with {proc.popen.returncode}\n{proc.tail()}")
        time.sleep(0.2)
    raise BenchError(f"{spec.label} not ready after {timeout:.0f} s\n{proc.tail()}")


def _mlx_lm(spec: Spec, model: Path, logs: Path, timeout: float) -> Running:
    """mlx_lm.server in one process, with the OpenBLAS our ranks preload (the same BLAS)."""
    port = free_port()
    argv = [PY, "-m", "mlx_lm.server", "--model", str(model), "--host", "127.0.0.1"]
    proc = start_proc("mlx-lm", [*argv, "--port", str(port)], logs, same_blas_env(1))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.running:
            raise BenchError(f"mlx-lm exited with {proc.popen.returncode}\n{proc.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return Running(spec, f"http://127.0.0.1:{port}/v1", "default_model", [proc])
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.3)
    raise BenchError(f"mlx-lm not answering after {timeout:.0f} s\n{proc.tail()}")


def stop(servers: list[Running]) -> None:
    stop_procs([p for s in servers for p in s.procs])


__all__ = ["BIN", "Running", "Spec", "groups", "start", "stop"]
