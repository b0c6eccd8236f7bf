"""Start real `python -m cluster.rank` processes on 127.0.0.1 (ring backend) and watch them.

Each rank gets its RankJob line on stdin (kept open: EOF means "launcher gone"); stdout and
stderr are read by threads so a test can wait for events while the ranks run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.job import RankJob, parse_event

ROOT = Path(__file__).resolve().parents[2]


_NEXT_PORT = itertools.count()
PORTS_PER_WORKER = 2000


def free_ports(n: int) -> list[int]:
    """Ports for a ring's ranks, below the ephemeral range (32768 up on Linux), in a block of
    this pytest worker's own: a port taken from the ephemeral range could be handed to another
    test's outgoing connection, or to another worker, before the rank bound it, and its ring
    then broke at the first send (seen in CI: errno 32 on 3 uneven ranks)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    base = 20000 + PORTS_PER_WORKER * (int(worker) % 6 if worker.isdigit() else 0)
    ports: list[int] = []
    for _ in range(2 * PORTS_PER_WORKER):
        if len(ports) == n:
            return ports
        port = base + next(_NEXT_PORT) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or lingering from an earlier ring
                continue
        ports.append(port)
    raise RuntimeError(f"no free ports in {base}..{base + PORTS_PER_WORKER - 1}")


def host_job(n: int = 2, rank: int = 0, ips: list[str] | None = None, **kw: Any) -> RankJob:
    """A job line as the launcher writes it for rank `rank` of `n` whose ring hostfile lists
    `ips` (127.0.0.1 for all: --local n); nothing is started."""
    ips = ips or ["127.0.0.1"] * n
    files = {"MLX_HOSTFILE": json.dumps([[f"{ip}:{5000 + i}"] for i, ip in enumerate(ips)])}
    fields: dict[str, Any] = {"rank": rank, "world_size": n, "backend": "ring", "model": "m"}
    fields |= {"strategy": "tensor", "files": files if n > 1 else {}}
    return RankJob(**{**fields, **kw})


def ring_jobs(n: int, model: str | Path, strategy: str = "tensor", **fields: Any) -> list[RankJob]:
    """One job per rank; the ring hostfile travels in `files` as mlx.launch would write it."""
    hostfile = json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(n)])
    files = {"MLX_HOSTFILE": hostfile} if n > 1 else {}
    return [
        RankJob(
            rank=r,
            world_size=n,
            backend="ring",
            strategy=strategy,
            model=str(model),
            files=files,
            **fields,
        )
        for r in range(n)
    ]


@dataclass
class Rank:
    proc: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)  # lines that are not events

    def event(self, name: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e["event"] == name), None)

    @property
    def text(self) -> str:
        return "".join(self.stdout)


class Ranks:
    """Running ranks; `finish()` waits (bounded) and kills whatever is left."""

    def __init__(self, jobs: list[RankJob], env: dict[str, str] | None = None) -> None:
        self.ranks: list[Rank] = []
        self.readers: list[threading.Thread] = []
        self.changed = threading.Condition()
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        for job in jobs:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cluster.rank"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=full_env,
                start_new_session=True,
            )
            assert proc.stdin is not None
            proc.stdin.write(job.to_line())
            proc.stdin.flush()
            rank = Rank(proc)
            self.ranks.append(rank)
            for read in (self._read_stdout, self._read_stderr):
                reader = threading.Thread(target=read, args=(rank,), daemon=True)
                reader.start()
                self.readers.append(reader)

    def _read_stdout(self, rank: Rank) -> None:
        assert rank.proc.stdout is not None
        while chunk := rank.proc.stdout.read(1):
            rank.stdout.append(chunk)

    def _read_stderr(self, rank: Rank) -> None:
        assert rank.proc.stderr is not None
        for line in rank.proc.stderr:
            event = parse_event(line)
            with self.changed:
                (rank.events.append(event) if event else rank.stderr.append(line.rstrip()))
                self.changed.notify_all()

    def wait_for(self, test: Callable[[], bool], timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(test, timeout)

    def finish(self, timeout: float = 90) -> list[Rank]:
        deadline = time.monotonic() + timeout
        for rank in self.ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rank.proc.wait(max(0.1, deadline - time.monotonic()))
        self.kill()
        for reader in self.readers:  # the pipes are at EOF once every rank is gone
            reader.join(10)
        return self.ranks

    def kill(self) -> None:
        for rank in self.ranks:
            if rank.proc.poll() is None:
                os.killpg(rank.proc.pid, signal.SIGKILL)
            rank.proc.wait(10)
            if rank.proc.stdin:
                with contextlib.suppress(OSError):
                    rank.proc.stdin.close()


def run_ranks(jobs: list[RankJob], timeout: float = 90) -> list[Rank]:
    return Ranks(jobs).finish(timeout)
