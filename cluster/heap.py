"""On Linux (glibc): a rank gives the big buffers MLX frees back to the system at once, reuses
a step's own transient buffers, and `serve` keeps one malloc arena for all its threads.

glibc serves a request of 128 KiB or more with its own mapping, but each time such a block is
freed it raises that threshold to the block's size (up to 32 MiB): from then on MLX's KV caches
and activations come from the heap, and what is freed there stays in the rank's RSS. Measured
with scripts/soak.py (`--local 1`, 7 minutes, the tiny model): RSS 2.1 GiB against 1.4 GiB of
MLX memory, rising with every new high-water mark of the batch; a malloc_trim(0) from outside
gave 0.55 GiB back and it was re-taken within 20 s. With the threshold held at glibc's own
starting value RSS stayed within 0.1 GiB of MLX's count, so RSS again says what the rank holds.

Held that low, though, every step mapped, faulted in and unmapped its logits afresh (8 rows of
SmolLM2's 49,152-token vocabulary in float32: 1.5 MiB, several such arrays a step): 145-355 page
faults a token at 8 clients, 57-60 tok/s. Held at 4 MiB, with glibc also keeping up to 32 MiB
free at the heap's top (its trim threshold, else 128 KiB: the top was given back and faulted in
again every step), a step's transients are reused from the heap: 0 faults a token after the
first round, 67-76 tok/s (session 20, one rank, SmolLM2 float32; mlx-lm's server 65-71 with 68
faults a token). Blocks under 4 MiB (a small model's KV caches, the prefix cache's entries) then
live on the heap too, and a 6-minute soak's RSS crept +13.5 % over MLX's +4.1 %; so a serving
rank also hands the heap's free pages back every TRIM_EVERY_S (`give_back`: malloc_trim), which
costs a few page faults per interval instead of per step.

glibc also gives threads arenas of their own (up to 8 per core), and memory freed in one arena
serves only the threads that get that arena later. Every rank job `serve` starts brings new
threads (three readers per rank, a keep-alive), so re-plans left serve holding more: in the
failover soak (`--local 3`, a kill every 2 minutes) its thread arenas took 0.95 and 0.35 MiB
more RSS at the two kills, and each same-shape restart under load another 30-170 KiB. With one
arena what the last job freed serves the next (+0.39 and +0.02 MiB at those kills); the
launcher's threads allocate under the GIL anyway, so sharing costs no concurrency.

A user's MALLOC_MMAP_THRESHOLD_ / MALLOC_ARENA_MAX wins; elsewhere (macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
M_ARENA_MAX = -8
M_TRIM_THRESHOLD = -1
MMAP_THRESHOLD_BYTES = 4 << 20  # held fixed (no dynamic raise): see above
TRIM_THRESHOLD_BYTES = 32 << 20
TRIM_EVERY_S = 5.0


def return_freed_buffers() -> bool:
    """Hold glibc's mmap and trim thresholds fixed in this process; whether the first was set."""
    _mallopt("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    return _mallopt("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def give_back() -> bool:
    """The heap's free pages back to the system (glibc's malloc_trim(0)); whether any went.
    Measured here: 1-3 ms, 80 ms right after 1.2 GB of scattered blocks were freed."""
    trim = _glibc("malloc_trim", (ctypes.c_size_t,))
    return trim is not None and bool(trim(0))


def share_one_arena() -> bool:
    """Every thread of this process allocates from glibc's main arena; whether it was set.
    Call it before the process starts threads: one that already has an arena keeps it."""
    return _mallopt("MALLOC_ARENA_MAX", M_ARENA_MAX, 1)


def _mallopt(env: str, param: int, value: int) -> bool:
    mallopt = None if env in os.environ else _glibc("mallopt", (ctypes.c_int, ctypes.c_int))
    return mallopt is not None and bool(mallopt(param, value))


@functools.cache
def _glibc(name: str, argtypes: tuple[Any, ...]) -> Any:
    """This process's C library function `name` (looked up once), or None off Linux or glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # not glibc
        return None
    function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function
