"""Test-only: what the serve process itself holds, so a test can tell a leak across re-plans
from noise (tests/launcher/test_serve_replan_memory.py).

With MLX_CLUSTER_TEST_MEMORY_PROBE=1, serve traces its Python allocations from the start and
each SIGUSR1 logs one line, `memory probe {...}`, taken after a full garbage collection: the
Python memory still allocated (tracemalloc), the live threads by name, the open file
descriptors by kind and the RSS. A thread of its own writes it (a signal handler that wrote
could find stderr's lock held by the very code it interrupted). Off by default: tracing
every allocation costs time and memory.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "MLX_CLUSTER_TEST_MEMORY_PROBE"
PREFIX = "memory probe "


def install(log: Callable[[str], None]) -> bool:
    """Start tracing and answer SIGUSR1, if the variable asks for it; whether it did."""
    if os.environ.get(ENV) != "1" or threading.current_thread() is not threading.main_thread():
        return False
    tracemalloc.start()
    asked = threading.Event()
    signal.signal(signal.SIGUSR1, lambda _n, _f: asked.set())

    def answer() -> None:
        while asked.wait():
            asked.clear()
            log(PREFIX + json.dumps(measure(), separators=(",", ":")))

    threading.Thread(target=answer, daemon=True, name="memory probe").start()
    return True


def measure() -> dict[str, Any]:
    gc.collect()
    return {
        "python_bytes": tracemalloc.get_traced_memory()[0],
        "threads": sorted(t.name for t in threading.enumerate()),
        "fds": _fds(),
        "rss_bytes": _rss(),
    }


def _fds() -> dict[str, int] | None:
    """Open descriptors by kind (pipe, socket, anon_inode, file); None without /proc."""
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        return None
    kinds: Counter[str] = Counter()
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
        kind = target.partition(":")[0] if target.endswith("]") else "file"
        kinds[kind] += 1
    return dict(kinds)


def _rss() -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        resident = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident * os.sysconf("SC_PAGE_SIZE")
