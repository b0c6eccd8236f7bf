"""`python -m cluster.rank`: one rank of a cluster job (see cluster/job.py for the contract).

Reads the RankJob line from stdin (on Linux it then executes itself again once, with an
optimized BLAS preloaded when the host has one: cluster/blas.py), then hands stdin to a small
guard process (cluster/rank_guard.py) that relays the launcher's lines and kills this rank when
the launcher is gone or progress stalls — even while an MLX call holds the GIL. Here a watchdog
thread exits at stdin EOF (the usual, GIL-free case), a heartbeat thread reports every
heartbeat_s, and the main thread initialises MLX distributed, loads this rank's shard and
decodes. Exit codes: 0 done, 1 failed, 2 unusable input (model, shapes, job), 3 the launcher
went away, 130 interrupted, 143 stopped by SIGTERM.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict
from typing import Any, TextIO

from cluster import blas, heap, host_cores, transformers_table
from cluster.event_writer import EventWriter
from cluster.job import RankJob, event_line
from topology.errors import InputError

EXIT_FAILED, EXIT_INPUT, EXIT_ORPHANED = 1, 2, 3
EXIT_TERMINATED = 128 + 15  # as a shell reports a SIGTERM


class Reporter:
    """Event lines on stderr (one writer at a time, the guard included) and what the heartbeat
    says."""

    def __init__(self, stream: TextIO, writer: EventWriter, rank: int) -> None:
        self.stream, self.writer, self.rank = stream, writer, rank
        self.lock = threading.Lock()
        self.stage = "starting"
        self.last_progress = time.monotonic()

    def _progressed(self) -> None:
        self.last_progress = time.monotonic()

    def emit(self, event: str, **data: Any) -> None:
        if event in ("progress", "loading"):
            self._progressed()
        line = event_line(event, **{"rank": self.rank, **data})
        with self.lock:
            try:
                self.stream.flush()  # stray text written before the event comes first
                self.writer.write(line)
            except (OSError, ValueError):  # nobody is reading any more
                pass

    def enter(self, stage: str, **data: Any) -> None:
        self.stage = stage
        self.emit(stage, **data)
        self._progressed()

    def heartbeat(self) -> None:
        age = round(time.monotonic() - self.last_progress, 3)
        self.emit("heartbeat", stage=self.stage, progress_age_s=age, **_memory(), **_steps())


def _memory() -> dict[str, int]:
    """MLX's peak, active and cache memory once the rank has imported it (importing it here
    would come before the job's environment is set); serve's dashboard shows the peak per rank,
    and a soak run (scripts/soak.py) watches active + cache for growth."""
    mx = sys.modules.get("mlx.core")
    if mx is None:
        return {}
    out: dict[str, int] = {}
    for key, read in (
        ("peak_memory_bytes", "get_peak_memory"),
        ("active_memory_bytes", "get_active_memory"),
        ("cache_memory_bytes", "get_cache_memory"),
    ):
        with contextlib.suppress(Exception):  # an MLX without it: the heartbeat goes regardless
            out[key] = int(getattr(mx, read)())
    return out


def _steps() -> dict[str, float]:
    """A serving rank's median decoding step since its last heartbeat (cluster/serve/step_times.py;
    looked up, not imported, so a rank that does not serve never loads it)."""
    # getattr: the module is in sys.modules while the main thread still runs its body
    take = getattr(sys.modules.get("cluster.serve.step_times"), "take", None)
    step_s = None if take is None else take()
    return {} if step_s is None else {"step_s": round(step_s, 6)}


# Lines after the job line: serve mode's requests (cluster/serve/loop.py); unread otherwise.
STDIN_LINES: queue.Queue[str] = queue.Queue()


def _watch_stdin(stdin: TextIO) -> None:
    """Launcher gone (stdin EOF) → exit now, even if the main thread is in a collective."""
    try:
        while line := stdin.readline():
            STDIN_LINES.put(line)
    except (OSError, ValueError):
        pass
    os._exit(EXIT_ORPHANED)


class Terminated(Exception):
    """SIGTERM from the launcher (or a service manager)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _beat(reporter: Reporter, every: float) -> None:
    while True:
        time.sleep(every)
        reporter.heartbeat()


def _read_job_line() -> str:
    """The first line of fd 0, read byte by byte so nothing after it is buffered here."""
    data = bytearray()
    while not data.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        data += byte
    return data.decode("utf-8", errors="replace")


_GUARD: list[subprocess.Popen[bytes]] = []  # kept referenced for the rank's lifetime


def _start_guard(job: RankJob, writer: EventWriter) -> None:
    """Start cluster/rank_guard.py on our stdin; our fd 0 becomes its relay."""
    relay_r, relay_w = os.pipe()
    config = {
        "rank": job.rank,
        "orphan_s": job.orphan_timeout_s,
        "links": job.links,
        "events_lock_fd": writer.lock_fd,
    }
    _GUARD.append(
        subprocess.Popen(
            [sys.executable, "-m", "cluster.rank_guard", str(os.getpid()), json.dumps(config)],
            stdin=0,
            stdout=relay_w,
            pass_fds=() if writer.lock_fd is None else (writer.lock_fd,),
        )
    )
    os.close(relay_w)
    os.dup2(relay_r, 0)
    os.close(relay_r)


def run(job: RankJob, reporter: Reporter, text_out: TextIO) -> None:
    """Initialise, load, decode and say "done"; raises on failure."""
    from cluster.distributed import init_group, job_environment
    from cluster.files.model_files import PeerShare, serve_own_files

    # This host's files the other ranks lack, served from the start (before the group forms,
    # so they are there when a peer asks); they live as long as this rank.
    share = PeerShare.from_job(job.share) if job.share is not None else None
    serving = serve_own_files(job.model, share) if share is not None else []
    if share is not None and share.serve is not None:
        reporter.emit("sharing", files=len(share.serve.get("files") or []), servers=len(serving))
    if job.mode in ("bench", "calibrate"):  # timed runs: cluster/bench/measure.py
        from cluster.bench.measure import run_measurement

        return run_measurement(job, reporter)
    if job.mode not in ("generate", "serve"):
        raise InputError(f"mode {job.mode!r} is not supported by this rank")
    reporter.enter("init", backend=job.backend, world_size=job.world_size)
    with job_environment(job):
        group = init_group(job)
    # mlx-lm is imported only now: MLX had to see the job's environment first.
    from cluster.generate import decode
    from cluster.load import shard_for_job

    reporter.enter("load", model=job.model, strategy=job.strategy, blas=blas.in_use())
    started = time.monotonic()
    shard = shard_for_job(job, group, reporter.emit)
    reporter.enter(
        "decode",
        layers=list(shard.layers),
        files=len(shard.files),
        load_s=round(time.monotonic() - started, 3),
        copied=asdict(shard.fetched),
    )
    if job.mode == "serve":  # until the launcher closes stdin
        from cluster.serve.loop import serve

        return serve(job, shard.model, shard.tokenizer, group, reporter.emit, STDIN_LINES)
    decoded = decode(job, shard.model, shard.tokenizer, group, reporter.emit, out=text_out)
    reporter.enter("done", peak_memory_bytes=decoded.peak_memory_bytes)


def main() -> int:
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found"
    stderr, text_out = sys.stderr, sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not mix with the text
    try:
        line = blas.handed_job_line()  # set when this process is the BLAS re-execution
        line = _read_job_line() if line is None else line
        job = RankJob.from_line(line)
    except (ValueError, TypeError) as e:
        stderr.write(event_line("error", rank=None, kind="input", message=f"bad job line: {e}"))
        return EXIT_INPUT
    # On Linux each of a host's ranks keeps to cores of its own (cluster/host_cores.py): first,
    # so the BLAS re-execution and every thread started later inherit them.
    host_cores.pin(job, os.environ)
    try:  # on Linux: execute again with an optimized BLAS preloaded (cluster/blas.py)
        blas.switch(job, line)
    except InputError as e:
        stderr.write(event_line("error", rank=job.rank, kind="input", message=str(e)))
        return EXIT_INPUT
    heap.return_freed_buffers()  # before MLX allocates: RSS then follows what MLX holds
    transformers_table.install()  # before mlx-lm imports transformers: half its import CPU
    writer = EventWriter.create()
    _start_guard(job, writer)
    stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    reporter = Reporter(stderr, writer, job.rank)
    # SIGTERM is the launcher's "stop now": unwind like Ctrl-C (MLX and the RDMA resources are
    # released on the way out); a rank stuck inside a collective gets SIGKILL after the grace.
    signal.signal(signal.SIGTERM, _terminated)
    threading.Thread(target=_watch_stdin, args=(stdin,), daemon=True).start()
    threading.Thread(target=_beat, args=(reporter, max(job.heartbeat_s, 0.05)), daemon=True).start()
    reporter.enter("started", pid=os.getpid(), host=socket.gethostname())
    try:
        run(job, reporter, text_out)
    except InputError as e:
        reporter.emit("error", kind="input", stage=reporter.stage, message=str(e))
        return EXIT_INPUT
    except KeyboardInterrupt:
        reporter.emit("error", kind="interrupted", stage=reporter.stage, message="interrupted")
        return 130
    except Terminated:
        reporter.emit("stopped", stage=reporter.stage, signal="SIGTERM")
        return EXIT_TERMINATED
    except Exception as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
        message = f"{type(e).__name__}: {e}".splitlines()[0]
        reporter.emit("error", kind="runtime", stage=reporter.stage, message=message, where=where)
        if os.environ.get("MLX_CLUSTER_DEBUG"):
            traceback.print_exc()
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    code = main()
    for stream in (sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    # Skip interpreter teardown: MLX's backend threads must not outlive a failed peer's wait.
    os._exit(code)
