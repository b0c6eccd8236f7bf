"""A host's cores and the job's ranks on it: how many ranks share the host, and (on Linux) each
rank kept to a block of the cores of its own.

Left free, the kernel moves a rank's threads between cores: its evaluation thread, its graph-
building main thread and its ring socket threads wake wherever a core is free, often one the
other rank is computing on, and every collective waits for the slower wake-up. Kept to its own
cores, a rank's threads wake where they slept. `serve --local 2` on 2 cores, 1 streaming client:
53–56 tok/s free, 61–80 kept apart (README, Serving). Each rank takes an equal block of the cores
this process may run on, in the order of its rank among the host's ranks (a remainder is left to
the launcher); nothing is done for a rank alone on its host, with more ranks than cores, off
Linux (macOS has no such call) or with MLX_CLUSTER_PIN=off, and only for tensor parallel ranks,
which compute at once: pipeline stages compute one at a time, and a stage left free borrows the
idle stage's core for its graph building (tiny float32 pipeline ×2 here: 72.7 tok/s kept apart,
90.4 free in the grid before).

The rank does it first thing (cluster/rank.py), before the BLAS re-execution and before any
thread starts, so every thread it ever has inherits the block; the host's count of cores is
kept in MLX_CLUSTER_HOST_CORES for what sizes itself by the host after that (BLAS threads, the
ring's wait). Only the standard library: this runs before MLX is imported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from cluster.job import RankJob

CHOICE_ENV = "MLX_CLUSTER_PIN"  # auto (default) | off
HOST_CORES_ENV = "MLX_CLUSTER_HOST_CORES"  # the cores this rank could use before its block


def ranks_here(job: RankJob) -> list[int] | None:
    """The job's ranks on this rank's host, in rank order (the ring hostfile: ranks on one host
    list the same first address, 127.0.0.1 for --local); None when unknown."""
    if job.world_size <= 1:
        return [job.rank]
    try:
        hosts: Any = json.loads(job.files.get("MLX_HOSTFILE") or "null")
        firsts = [str(h[0]).rsplit(":", 1)[0] for h in hosts]
        mine = firsts[job.rank]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    if len(firsts) != job.world_size:
        return None
    return [r for r, f in enumerate(firsts) if f == mine]


def ranks_on_this_host(job: RankJob) -> int | None:
    here = ranks_here(job)
    return None if here is None else len(here)


def allowed() -> list[int]:
    """The cores this process may run on now (every core where the call does not exist)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cores(environ: Mapping[str, str] = os.environ) -> int:
    """The host's cores for this rank's job: as many as it could use before it took its block."""
    try:
        return max(1, int(environ[HOST_CORES_ENV]))
    except (KeyError, ValueError):
        return len(allowed())


def block(index: int, ranks: int, usable: Sequence[int]) -> list[int] | None:
    """The cores of the `index`th of `ranks` ranks sharing `usable`; None when there is nothing
    to keep apart (one rank) or too little to give each a core."""
    if ranks <= 1 or ranks > len(usable) or not 0 <= index < ranks:
        return None
    each = len(usable) // ranks
    return list(usable[index * each : (index + 1) * each])


def pin(job: RankJob, environ: MutableMapping[str, str]) -> list[int] | None:
    """Keep this process, and every thread it has and will start, to its block of cores; the
    block, or None when left as it was. Records the host's count in HOST_CORES_ENV."""
    off = environ.get(CHOICE_ENV, "auto") == "off" or job.strategy != "tensor"
    # HOST_CORES_ENV set: the BLAS re-execution of a rank placed already (it inherited its block)
    if off or not sys.platform.startswith("linux") or HOST_CORES_ENV in environ:
        return None
    here = ranks_here(job)
    usable = allowed()
    mine = None if here is None else block(here.index(job.rank), len(here), usable)
    if mine is None:
        return None
    for task in _tasks():
        try:
            os.sched_setaffinity(task, mine)
        except OSError:  # a thread that has just ended
            continue
    environ[HOST_CORES_ENV] = str(len(usable))
    return mine


def _tasks() -> list[int]:
    """This process's threads (0, the calling one, where /proc cannot be read)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
