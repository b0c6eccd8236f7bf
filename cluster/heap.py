"""On Linux (glibc) a rank gives the big buffers MLX frees back to the system at once.

glibc serves a request of 128 KiB or more with its own mapping, but each time such a block is
freed it raises that threshold to the block's size (up to 32 MiB): from then on MLX's KV caches
and activations come from the heap, and what is freed there stays in the rank's RSS. Measured
with scripts/soak.py (`--local 1`, 7 minutes, the tiny model): RSS 2.1 GiB against 1.4 GiB of
MLX memory, rising with every new high-water mark of the batch; a malloc_trim(0) from outside
gave 0.55 GiB back and it was re-taken within 20 s. With the threshold held at glibc's own
starting value RSS stayed within 0.1 GiB of MLX's count, so RSS again says what the rank holds.
A user's MALLOC_MMAP_THRESHOLD_ wins; elsewhere (macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default, held fixed (no dynamic raise)


def return_freed_buffers() -> bool:
    """Hold glibc's mmap threshold fixed in this process; whether it was set."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
