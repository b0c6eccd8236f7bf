"""Linux ranks give freed big buffers back to the system (cluster/heap.py): glibc, left to
itself, keeps them on the heap once a big block has been freed; with the threshold held they
leave the process's RSS as soon as they are freed. And serve's threads share one malloc arena
(each rank job's new threads would otherwise take arenas of their own). Each case runs in a
fresh interpreter (the allocator's state is per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import heap

ROOT = Path(__file__).resolve().parents[2]
MB = 1 << 20
# Before every script: argv[1] names what cluster/heap.py sets ("default": nothing), then libc.
PRELUDE = """
import ctypes, sys, threading
from cluster import heap
if sys.argv[1] == "held":
    assert heap.return_freed_buffers()
if sys.argv[1] == "held at 128 KiB":  # the value ranks held before session 20
    assert ctypes.CDLL(None).mallopt(heap.M_MMAP_THRESHOLD, 128 << 10)
if sys.argv[1] == "shared":
    assert heap.share_one_arena()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
"""
SCRIPT = """
size = 8 << 20
first = libc.malloc(size); libc.memset(first, 1, size); libc.free(first)  # a big block freed
blocks = [libc.malloc(size) for _ in range(24)]
for b in blocks:
    libc.memset(b, 1, size)
before = rss()
for b in blocks[:-1]:  # the last stays: a heap cannot shrink below a block in use
    libc.free(b)
print(before - rss())
"""
# A step's transient (a batch's logits, 1.5 MiB) made, written and freed 50 times: page faults.
STEPS = """
import resource
size = 3 << 19
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    block = libc.malloc(size); libc.memset(block, 1, size); libc.free(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
# Blocks under the held threshold (a small model's KV caches) freed: kept on the heap until
# give_back(); prints what each of the two steps gave back.
GIVE_BACK = """
size = 1 << 20
blocks = [libc.malloc(size) for _ in range(96)]
for b in blocks:
    libc.memset(b, 1, size)
start = rss()
for b in blocks[:-1]:  # the last stays: the heap's top cannot shrink below it
    libc.free(b)
freed = rss()
heap.give_back()
print(start - freed, freed - rss())
"""
# Eight threads that allocate at once, as one rank job's readers do; glibc then lists its arenas.
ARENAS = """
together = threading.Barrier(8)
def job():
    block = libc.malloc(64 << 10)
    together.wait()
    libc.free(block)
threads = [threading.Thread(target=job) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_stats()  # "Arena N:" per arena, on stderr
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's allocator: Linux ranks only"
)


def _run(script: str, mode: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + script, mode], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip


def _freed(mode: str) -> int:
    return int(_run(SCRIPT, mode).stdout.strip())


def _arenas(mode: str) -> int:
    return _run(ARENAS, mode).stderr.count("Arena ")


def test_freed_big_buffers_leave_rss_only_with_the_threshold_held() -> None:
    assert _freed("default") < 32 * MB  # glibc kept them: what the rank would carry
    assert _freed("held") > 150 * MB  # 23 blocks of 8 MiB went back at once


def test_a_steps_transient_buffers_are_reused_not_faulted_in_each_time() -> None:
    pages = (3 << 19) // 4096
    assert int(_run(STEPS, "held").stdout) < 2 * pages  # once (at most), then from the heap
    # held at glibc's starting value it was mapped, faulted in and unmapped every time
    assert int(_run(STEPS, "held at 128 KiB").stdout) > 40 * pages


def test_freed_blocks_kept_on_the_heap_go_back_when_given_back() -> None:
    kept, given = (int(x) for x in _run(GIVE_BACK, "held").stdout.split())
    assert kept < 16 * MB  # under the threshold: the heap kept them
    assert given > 64 * MB  # 95 blocks of 1 MiB went back at give_back()


def test_threads_share_the_main_arena_only_when_asked() -> None:
    assert _arenas("default") > 1  # the threads took arenas of their own
    assert _arenas("shared") == 1


def test_a_users_own_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert heap.return_freed_buffers() is False
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert heap.share_one_arena() is False
