"""MLX distributed setup for one rank: environment and files first, then `init`.

MLX reads its backend settings from the environment when `mx.distributed.init` runs, and the
ring/jaccl settings name files (MLX_HOSTFILE, MLX_IBV_DEVICES). Like mlx.launch, the files
travel inside the job and are written to a private temp dir; the env var holds the path.
This module imports mlx.core only inside `init_group`, after `apply_job_env` has run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cluster import ring_wait
from cluster.host_cores import cores, ranks_on_this_host
from cluster.job import RankJob
from topology.errors import InputError
from topology.planning.hostfile import missing_devices

BACKENDS = ("ring", "jaccl", "jaccl-ring")
# What each backend needs from the environment (mlx 0.32: ring.cpp / jaccl.cpp).
REQUIRED_ENV = {
    "ring": ("MLX_HOSTFILE",),
    "jaccl": ("MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR"),
    "jaccl-ring": ("MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR"),
}


def job_env(job: RankJob, file_dir: Path) -> dict[str, str]:
    """The variables this rank must set, writing the job's files into `file_dir`.

    Checks the settings MLX would otherwise reject with a terse error (or, for jaccl, a hang):
    the backend name, the required variables, and the shape of the hostfile / device matrix.
    """
    if job.world_size < 1 or not 0 <= job.rank < job.world_size:
        raise InputError(f"job has rank {job.rank} of world size {job.world_size}: launcher bug")
    env = dict(job.env)
    for name, content in job.files.items():
        path = file_dir / f"{name.lower()}.json"
        path.write_text(content)
        env[name] = str(path)
    if job.world_size == 1:
        return env
    if job.backend not in BACKENDS:
        raise InputError(f"unknown backend {job.backend!r}: use one of {', '.join(BACKENDS)}")
    if env.setdefault("MLX_RANK", str(job.rank)) != str(job.rank):
        raise InputError(f"job env MLX_RANK={env['MLX_RANK']} but the job is rank {job.rank}")
    if job.backend == "jaccl-ring":
        env["MLX_JACCL_RING"] = "1"
    missing = [name for name in REQUIRED_ENV[job.backend] if name not in env]
    if missing:
        raise InputError(f"the {job.backend} job lacks {', '.join(missing)}: launcher bug")
    if job.backend == "ring":
        _check_ring_hostfile(job.files.get("MLX_HOSTFILE"), job.world_size)
    else:
        _check_device_matrix(job.files.get("MLX_IBV_DEVICES"), job)
    return env


def _check_ring_hostfile(content: str | None, world_size: int) -> None:
    if content is None:  # the path came in through env: the file is the launcher's business
        return
    hosts = _parse(content, "MLX_HOSTFILE")
    ok = isinstance(hosts, list) and all(isinstance(h, list) and h for h in hosts)
    if not ok or len(hosts) != world_size:
        raise InputError(f"MLX_HOSTFILE must list {world_size} non-empty lists of ip:port")


def _check_device_matrix(content: str | None, job: RankJob) -> None:
    if content is None:
        return
    matrix = _parse(content, "MLX_IBV_DEVICES")
    n = job.world_size
    if (
        not isinstance(matrix, list)
        or len(matrix) != n
        or any(not isinstance(row, list) or len(row) != n for row in matrix)
    ):
        raise InputError(f"MLX_IBV_DEVICES must be a {n}x{n} matrix of RDMA device names")
    if any(matrix[i][i] is not None for i in range(n)):
        raise InputError("MLX_IBV_DEVICES must have null on its diagonal (no device to self)")
    # jaccl needs every pair, jaccl-ring only the neighbours
    ring = job.backend == "jaccl-ring"
    ranks = [str(i) for i in range(n)]
    me = ranks[job.rank]
    lacking = sorted(int(p) for h, p in missing_devices(ranks, matrix, ring) if h == me)
    if lacking:
        raise InputError(
            f"MLX_IBV_DEVICES names no RDMA device from rank {job.rank} to ranks {lacking}"
        )


def _parse(content: str, name: str) -> Any:
    try:
        return json.loads(content)
    except json.JSONDecodeError as e:
        raise InputError(f"{name} is not valid JSON ({e.msg}): launcher bug") from None


@contextmanager
def job_environment(job: RankJob) -> Iterator[dict[str, str]]:
    """Set the job's env (files in a private temp dir) for the duration of `init_group`.

    The files are only read while MLX initialises, so the directory goes away afterwards and
    the variables naming those files are put back; the rest of the job's env stays set (the
    rank may read it later: HF_HUB_OFFLINE, MLX settings read lazily, ...).
    """
    file_dir = Path(tempfile.mkdtemp(prefix=f"mlx-cluster-rank{job.rank}-"))
    saved = {name: os.environ.get(name) for name in job.files}
    try:
        env = job_env(job, file_dir)
        os.environ.update(env)
        yield env
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(file_dir, ignore_errors=True)


def init_group(job: RankJob) -> Any:
    """`mx.distributed.init(strict=True)` for a multi-rank job (None for one rank); checks
    that MLX agrees with the job about rank and size."""
    if job.world_size == 1:
        return None
    import mlx.core as mx

    backend = "jaccl" if job.backend == "jaccl-ring" else job.backend
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as e:
        raise RuntimeError(f"{job.backend} init failed on rank {job.rank}: {e}") from None
    if backend == "ring" and ring_wait.should_sleep(ranks_on_this_host(job), cores(), os.environ):
        ring_wait.sleep_while_waiting(ring_wait.ring_endpoints(job.files.get("MLX_HOSTFILE", "")))
    if (group.rank(), group.size()) != (job.rank, job.world_size):
        raise InputError(
            f"MLX says rank {group.rank()} of {group.size()} but the job is rank "
            f"{job.rank} of {job.world_size}: the hostfile does not match the job"
        )
    return group
