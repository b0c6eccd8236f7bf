"""`python -m cluster.rank_guard`: a GIL-free watchdog beside each rank.

An MLX call can hold the GIL while it waits on a peer that vanished (seen: `mx.clear_cache()`
waiting on a ring all_sum), which freezes every Python thread of the rank, its stdin watcher
included. So the rank hands its stdin to this small process (no MLX in it): the guard relays
the launcher's lines to the rank, and kills the rank when the launcher is gone (stdin EOF) or
when the rank makes no progress for the job's stall deadline (a host cut off from everyone).

argv: RANK_PID RANK STALL_S LOAD_S PROGRESS_FD. stdin = the launcher's pipe, stdout = the rank's
new stdin, stderr = the rank's stderr (for the one event it may say). The rank writes a byte to
PROGRESS_FD at each progress event: b"D" once it decodes, b"." otherwise.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

from cluster.job import event_line

EOF_GRACE_S = 2.0  # the rank exits by itself on EOF (code 3) unless its GIL is held


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _stalled(rank: int, stage: str, limit: float) -> None:
    message = (
        f"no progress for {limit:g} s while {stage}: a peer or the launcher is unreachable; "
        "this rank stops itself"
    )
    with contextlib.suppress(OSError):
        os.write(2, event_line("error", rank=rank, kind="stalled", message=message).encode())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return os.getppid() != pid  # re-parented: the rank is gone


def guard(rank_pid: int, rank: int, stall_s: float, load_s: float, progress_fd: int) -> int:
    stdin_open, progress_open = True, True
    pending = b""
    decoding, last = False, time.monotonic()
    eof_at: float | None = None
    os.set_blocking(1, False)
    while True:
        readers = [fd for fd, on in ((0, stdin_open), (progress_fd, progress_open)) if on]
        writers = [1] if pending else []
        readable, writable, _ = select.select(readers, writers, [], 0.25)
        now = time.monotonic()
        if 0 in readable:
            data = os.read(0, 65536)
            if data:
                pending += data
            else:  # the launcher is gone: let the rank see EOF too, then make sure
                stdin_open, eof_at, pending = False, now, b""
                os.close(1)
        if 1 in writable and pending and stdin_open:
            try:
                pending = pending[os.write(1, pending) :]
            except BlockingIOError:
                pass
            except OSError:  # the rank is exiting: nothing more to relay
                pending = b""
        if progress_fd in readable:
            data = os.read(progress_fd, 4096)
            if not data:  # the rank exited
                progress_open = False
                return 0
            decoding = decoding or b"D" in data
            last = now
        if _gone(rank_pid):
            return 0
        if eof_at is not None and now - eof_at > EOF_GRACE_S:
            _kill(rank_pid)
            return 0
        limit = stall_s if decoding else load_s
        if limit > 0 and now - last > limit:
            _stalled(rank, "decoding" if decoding else "starting", limit)
            _kill(rank_pid)
            return 0


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle
    rank_pid, rank = int(sys.argv[1]), int(sys.argv[2])
    stall_s, load_s, progress_fd = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    return guard(rank_pid, rank, stall_s, load_s, progress_fd)


if __name__ == "__main__":
    sys.exit(main())
