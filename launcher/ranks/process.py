"""One running rank: its process, the threads reading its output, and how to stop it.

Every rank (a local `python -m cluster.rank` or the ssh client running it remotely) starts in a
new session, so it is its own process group: the terminal's Ctrl-C does not reach it directly
and stopping the group also stops anything the rank started.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import IO, Any

from cluster.job import RankJob, parse_event

STDERR_TAIL_LINES = 20
STAGE_EVENTS = ("started", "init", "load", "decode", "done")  # cluster.rank's stage changes


@dataclass(frozen=True)
class RankLaunch:
    """What to start for one rank: where it runs, the command, and the job for its stdin."""

    rank: int
    host: str  # shown in messages
    argv: tuple[str, ...]
    job: RankJob
    remote: bool = False  # an ssh client: the remote rank exits on its own at stdin EOF
    cwd: str | None = None


@dataclass(frozen=True)
class Report:
    """One thing a rank said or did, in the order the supervisor learns it."""

    rank: int
    kind: str  # "event" | "text" | "exit"
    event: dict[str, Any] | None = None
    text: str = ""
    code: int | None = None


class RankProcess:
    """A started rank; reader threads put its events, text and exit on a shared queue."""

    def __init__(self, launch: RankLaunch, reports: queue.Queue[Report]) -> None:
        self.launch = launch
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.error: str | None = None  # the message of the rank's own "error" event
        self.error_kind: str | None = None  # "input": the rank found the job/model unusable
        self.stage = "starting"  # what the rank last said it was doing (init, load, decode...)
        self.returncode: int | None = None
        self._reports = reports
        self._send_lock = threading.Lock()
        self._proc = subprocess.Popen(
            list(launch.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            cwd=launch.cwd,
            # As mlx.launch exports it; lets `ps e` / /proc tell local ranks apart.
            env={**os.environ, "MLX_RANK": str(launch.rank)},
        )
        self.pgid = self._proc.pid  # leader of its own session and group
        self._threads = [
            threading.Thread(target=read, daemon=True, name=f"rank {launch.rank} {part}")
            for read, part in (
                (self._read_stdout, "stdout"),
                (self._read_stderr, "stderr"),
                (self._wait, "exit"),
            )
        ]
        for t in self._threads:
            t.start()
        self._send_job()

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def _send_job(self) -> None:
        # stdin stays open after the job line: its EOF tells the rank the launcher is gone.
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(self.launch.job.to_line().encode())
            stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the rank died at once; its exit report says so

    def _read_stdout(self) -> None:
        out = self._proc.stdout
        assert out is not None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        fd = out.fileno()
        while chunk := os.read(fd, 4096):  # os.read returns what is there: text streams as made
            text = decoder.decode(chunk)
            if text:
                self._reports.put(Report(self.launch.rank, "text", text=text))

    def _read_stderr(self) -> None:
        err: IO[bytes] | None = self._proc.stderr
        assert err is not None
        for raw in err:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            event = parse_event(line)
            if event is None:
                if line.strip():
                    self.tail.append(line)
                continue
            if isinstance(event.get("stage"), str):
                self.stage = event["stage"]
            elif event.get("event") in STAGE_EVENTS:
                self.stage = str(event["event"])
            if event.get("event") == "error":
                self.error = str(event.get("message", ""))
                self.error_kind = str(event.get("kind", "")) or None
            self._reports.put(Report(self.launch.rank, "event", event=event))

    def _wait(self) -> None:
        code = self._proc.wait()
        self.returncode = code
        self._reports.put(Report(self.launch.rank, "exit", code=code))

    def drain_output(self, timeout_s: float) -> None:
        """Let the readers reach EOF (so the last stderr lines are known) for up to timeout_s."""
        end = time.monotonic() + timeout_s
        for t in self._threads[:2]:
            t.join(max(0.0, end - time.monotonic()))

    def send_line(self, line: str) -> bool:
        """One more line on the rank's stdin (serve's requests, the supervisor's keep-alives:
        one writer at a time, so lines never interleave); False when the rank is gone."""
        stdin = self._proc.stdin
        try:
            assert stdin is not None
            with self._send_lock:
                stdin.write(line.encode())
                stdin.flush()
        except (OSError, ValueError):  # broken pipe, or closed by stop_all
            return False
        return True

    def keep_alive(self) -> None:
        """An empty line for the rank's guard (cluster/rank_guard.py drops it), unless a line
        is being written right now: that is a sign of life too."""
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.write(b"\n")
                self._proc.stdin.flush()
        except (OSError, ValueError):
            pass
        finally:
            self._send_lock.release()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()

    def signal_group(self, sig: signal.Signals) -> None:
        # The group outlives its leader when the rank started children: signal it regardless.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def wait(self, timeout_s: float) -> bool:
        try:
            self._proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        return True


def stop_all(ranks: list[RankProcess], grace_s: float) -> list[RankProcess]:
    """Stop every rank: SIGTERM (+ SIGCONT for a stopped one) so it can release MLX and its
    RDMA resources on the way out, SIGKILL for those still running after the grace, then stdin
    closed. Returns the ranks that needed SIGKILL."""
    for r in ranks:
        if r.running:
            r.signal_group(signal.SIGTERM)
            r.signal_group(signal.SIGCONT)
    end = time.monotonic() + grace_s
    killed = []
    for r in ranks:
        if not r.wait(end - time.monotonic()):
            killed.append(r)
            r.signal_group(signal.SIGKILL)
    for r in ranks:
        r.close_stdin()
        r.wait(2.0)
        r.signal_group(signal.SIGKILL)  # anything left in the group (children of the rank)
    return killed
