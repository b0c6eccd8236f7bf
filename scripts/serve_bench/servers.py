"""The two servers under test, both on RANKS local ranks, tensor parallel, ring over 127.0.0.1:
ours (`mlx-cluster serve --local 2`, its default flags) and mlx-lm's own `mlx_lm.server` (its
ranks started directly with MLX_RANK / MLX_HOSTFILE, not through mlx.launch)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from .procs import Proc, free_port, start_proc

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
PY = str(BIN / "python")
CLI = str(BIN / "mlx-cluster")
RANKS = 2
READY_LINE = re.compile(r"mlx-cluster: serving .* at (http://\S+/v1)")
NAMES = ("mlx-cluster", "mlx-lm")


class BenchError(Exception):
    """A failure that ends the run: the message says what, where and which server."""


@dataclass
class Server:
    name: str  # "mlx-cluster" or "mlx-lm"
    base_url: str  # .../v1
    model: str  # the "model" field of its requests
    procs: list[Proc]

    def pids(self) -> list[int]:
        out = []
        for p in self.procs:
            p.remember_children()
            if p.running:
                out.append(p.popen.pid)
            out += p.live_known()
        return sorted(set(out))

    def check_alive(self) -> None:
        for p in self.procs:
            if not p.running:
                raise BenchError(
                    f"{self.name}: process {p.name} exited with code {p.popen.returncode}\n"
                    f"{p.tail()}"
                )

    def logs(self) -> str:
        return "\n".join(f"[{p.name}]\n{p.tail()}" for p in self.procs)


def same_blas_env(ranks: int) -> dict[str, str]:
    """What a rank of ours gives itself on this machine (cluster/blas.py), for mlx-lm's `ranks`
    processes: the system OpenBLAS preloaded, the cores split between them; empty without one."""
    from cluster import blas

    library = blas.find_openblas()
    if library is None:
        return {}
    env = blas.preload_env({}, {}, library, max(1, blas.cores() // ranks))
    return {k: env[k] for k in ("LD_PRELOAD", blas.THREADS_ENV)}


Waiter = Callable[[float], Server]  # a started server: wait up to this many seconds for it


def start_server(
    name: str,
    cli: str,
    model: Path,
    logs: Path,
    procs: list[Proc],
    same_blas: bool = True,
    own_cores: bool = False,
) -> Waiter:
    """Start one of NAMES (its processes go into `procs`); call the result to wait until ready.
    same_blas: mlx-lm's ranks get the OpenBLAS ours preload (else the wheel's bundled one);
    own_cores: each is kept to a block of cores as ours keep themselves (else left free)."""
    if name == "mlx-cluster":
        return partial(wait_ours, start_ours(cli, model, logs, procs), model)
    if name == "mlx-lm":
        return partial(wait_theirs, *start_theirs(model, logs, procs, same_blas, own_cores))
    raise ValueError(f"unknown server {name!r}")


def start_ours(cli: str, model: Path, logs: Path, procs: list[Proc]) -> Proc:
    argv = [cli, "serve", "--local", str(RANKS), "--model", str(model), "--port", "0"]
    proc = start_proc("mlx-cluster-serve", argv, logs)
    procs.append(proc)
    return proc


def wait_ours(proc: Proc, model: Path, timeout: float) -> Server:
    """Wait for serve's ready line on stdout ("mlx-cluster: serving MODEL at URL ...")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = READY_LINE.search(proc.out.read_text(errors="replace"))
        if found:
            proc.remember_children()
            return Server("mlx-cluster", found.group(1), str(model), [proc])
        if not proc.running:
            raise BenchError(
                f"mlx-cluster serve exited with code {proc.popen.returncode} before it was "
                f"ready\n{proc.tail()}"
            )
        time.sleep(0.2)
    raise BenchError(f"mlx-cluster serve not ready after {timeout:.0f} s\n{proc.tail()}")


def start_theirs(
    model: Path, logs: Path, procs: list[Proc], same_blas: bool = True, own_cores: bool = False
) -> tuple[list[Proc], int]:
    """mlx-lm's ranks; with same_blas, the BLAS and thread count ours give themselves; with
    own_cores, each under `taskset` to the block of cores ours would take (Linux)."""
    from cluster import host_cores

    blas = same_blas_env(RANKS) if same_blas else {}
    hostfile = logs / "mlx-lm-ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(RANKS)]))
    port = free_port()
    argv = [PY, "-m", "mlx_lm.server", "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    started = []
    for rank in range(RANKS):
        env = {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile), **blas}
        block = host_cores.block(rank, RANKS, host_cores.allowed()) if own_cores else None
        pinned = ["taskset", "-c", ",".join(map(str, block))] if block else []
        proc = start_proc(f"mlx-lm-rank{rank}", [*pinned, *argv], logs, env)
        procs.append(proc)
        started.append(proc)
    return started, port


def wait_theirs(ranks: list[Proc], port: int, timeout: float) -> Server:
    """Wait for rank 0's /health to answer 200 (the model still loads in the background: the
    warm-up round waits for that)."""
    server = Server("mlx-lm", f"http://127.0.0.1:{port}/v1", "default_model", ranks)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.3)
    raise BenchError(f"mlx-lm server: /health not answering after {timeout:.0f} s\n{server.logs()}")
