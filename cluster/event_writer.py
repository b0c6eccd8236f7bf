"""Whole event lines on a rank's stderr, written by two processes: the rank and its guard
(cluster/rank_guard.py).

A pipe keeps one write whole only up to PIPE_BUF (4 KiB): a longer line (a result with logits,
a batch of request events) is copied in pieces once the pipe fills, and the guard's line could
land between them. So both take a POSIX record lock on one unlinked file first. Record locks
belong to a process, not to a file descriptor, so the guard locks the very file it inherits.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time

GUARD_WAIT_S = 1.0  # the guard writes anyway after this: a rank stuck mid-write is not reading


class EventWriter:
    """Event lines to `out_fd`, each under the lock on `lock_fd` (None: no lock to share)."""

    def __init__(self, lock_fd: int | None, out_fd: int = 2) -> None:
        self.lock_fd, self.out_fd = lock_fd, out_fd

    @classmethod
    def create(cls) -> EventWriter:
        """A writer on a fresh lock file, unlinked at once; pass `lock_fd` to the guard."""
        with tempfile.TemporaryFile(prefix="mlx-cluster-events-") as handle:
            return cls(os.dup(handle.fileno()))

    def write(self, line: str, wait_s: float | None = None) -> None:
        """Write `line` whole; with `wait_s`, wait at most that long for the lock."""
        data = line.encode()
        locked = self._lock(wait_s)
        try:
            while data:  # os.write may take part of a long line
                data = data[os.write(self.out_fd, data) :]
        finally:
            if locked and self.lock_fd is not None:
                fcntl.lockf(self.lock_fd, fcntl.LOCK_UN)

    def _lock(self, wait_s: float | None) -> bool:
        if self.lock_fd is None:
            return False
        if wait_s is None:
            fcntl.lockf(self.lock_fd, fcntl.LOCK_EX)
            return True
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.lockf(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.002)
