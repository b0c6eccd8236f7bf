"""A download's `.part` file, resumed from what an earlier attempt left, and the per-file lock.

The `.part` keeps a running sha256 of exactly the bytes it holds, so a cut transfer resumes
where it stopped without hashing again what came before. The lock makes two ranks on one host
fetch each file once. No MLX here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from topology.errors import InputError

if TYPE_CHECKING:
    from _hashlib import HASH

HASH_CHUNK = 8 << 20  # reading back a partial download's prefix


@dataclass
class PartFile:
    """A `.part` file being filled: `hash` covers exactly its first `size` bytes."""

    path: Path
    file: io.FileIO
    hash: HASH
    size: int
    kept: int  # of those bytes, how many an earlier download left
    received: int = 0  # over the network, into this file
    broken: bool = False  # a write failed: later ones would leave a hole

    def append(self, data: memoryview) -> None:
        """Write `data` at the end (its hash is the caller's: in another thread)."""
        if self.broken:
            return  # the download ends with the first failure's InputError
        try:
            while data:
                n = self.file.write(data) or 0
                data, self.size, self.received = data[n:], self.size + n, self.received + n
        except OSError as e:
            self.broken = True
            raise InputError(f"cannot write {self.path}: {e.strerror or e}") from None

    def truncate(self) -> None:
        try:
            self.file.seek(0)
            self.file.truncate(0)
        except OSError as e:
            raise InputError(f"cannot write {self.path}: {e.strerror or e}") from None
        self.hash, self.size, self.kept = hashlib.sha256(), 0, 0


def open_part(path: Path, file: io.FileIO, size: int, started: Callable[[int], None]) -> PartFile:
    """The .part to resume: its prefix read back and hashed (emptied when longer than the
    file: it cannot be a prefix of it)."""
    h = hashlib.sha256()
    try:
        have = os.fstat(file.fileno()).st_size
        if have > size:
            file.truncate(0)
            have = 0
        started(have)
        buf = memoryview(bytearray(min(HASH_CHUNK, max(have, 1))))
        at = 0
        while at < have and (n := file.readinto(buf[: min(len(buf), have - at)]) or 0):
            h.update(buf[:n])
            at += n
        file.seek(at)
        file.truncate(at)  # what was hashed is what is kept
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    return PartFile(path, file, h, at, at)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`, which is removed on release. A waiter that wakes up on a
    lock file already removed locks afresh, so two holders never overlap."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise InputError(f"cannot create {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass  # removed by the holder this one waited for
        except OSError as e:
            os.close(fd)
            raise InputError(f"cannot lock {path}: {e.strerror or e}") from None
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still holding the lock: see above
        os.close(fd)
