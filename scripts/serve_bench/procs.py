"""The processes a benchmark starts: each the leader of its own process group, its output in log
files; stopped with SIGTERM, then SIGKILL for the group and every descendant seen."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 20.0  # ours stops its ranks on SIGTERM (15 s grace) before exiting
LOG_TAIL_CHARS = 3000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    try:  # Linux: the kernel's own list, per thread
        found: list[int] = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
        return found
    except OSError:
        pass
    done = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(c) for c in done.stdout.split()]


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def started_at(pid: int) -> str | None:
    """When the process started (Linux: field 22 of /proc/PID/stat), to tell a pid that was
    reused apart from the one we saw; None where there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class Proc:
    """One process we started, leader of its own process group, output in log files."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path
    known: dict[int, str | None] = field(default_factory=dict)  # descendant -> its start time

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def remember_children(self) -> None:
        if self.running:
            for pid in _descendants(self.popen.pid):
                self.known.setdefault(pid, started_at(pid))

    def live_known(self) -> list[int]:
        """The descendants seen that still run (and are still the processes we saw)."""
        return [pid for pid, t in sorted(self.known.items()) if alive(pid) and started_at(pid) == t]

    def tail(self) -> str:
        parts = []
        for path in (self.out, self.err):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if text.strip():
                parts.append(f"--- {path.name} (last lines)\n{text[-LOG_TAIL_CHARS:].rstrip()}")
        return "\n".join(parts) or "(no output)"


def start_proc(name: str, argv: list[str], logs: Path, env: dict[str, str] | None = None) -> Proc:
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    with out.open("wb") as o, err.open("wb") as e:
        popen = subprocess.Popen(
            argv,
            cwd=logs,  # not the checkout: `python -m` would import from it, whatever --cli says
            stdin=subprocess.DEVNULL,
            stdout=o,
            stderr=e,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own group: signals reach it and its children alike
        )
    return Proc(name, popen, out, err)


def stop_procs(procs: list[Proc]) -> None:
    """SIGTERM every group, wait for a graceful exit, then SIGKILL whatever is left: the groups
    and every descendant seen (ours starts its ranks in sessions of their own)."""
    for p in procs:
        p.remember_children()
    for p in procs:
        if p.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.running:
            p.remember_children()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait(timeout=10)
    time.sleep(0.5)  # ranks notice their launcher's exit (stdin EOF) and leave on their own
    for p in procs:
        for pid in p.live_known():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of these processes so far (Linux /proc only)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            if platform.system() != "Linux":
                return None
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total
