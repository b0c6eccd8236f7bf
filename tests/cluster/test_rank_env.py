"""What a rank hands MLX for each backend: environment variables and the files they name.

jaccl cannot initialise here (no RDMA), so these tests stop at what MLX would read; the ring
path is exercised end to end by the decode tests.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.distributed import job_env, job_environment
from cluster.job import RankJob
from topology.errors import InputError

MESH3 = [
    [None, "rdma_en2", "rdma_en3"],
    ["rdma_en2", None, "rdma_en5"],
    ["rdma_en3", "rdma_en5", None],
]


def job(backend: str, rank: int = 1, n: int = 3, **kw: object) -> RankJob:
    fields: dict = {
        "rank": rank,
        "world_size": n,
        "backend": backend,
        "strategy": "tensor",
        "model": "m",
    }
    if backend == "ring":
        fields["files"] = {"MLX_HOSTFILE": json.dumps([[f"10.0.0.{i}:5000"] for i in range(n)])}
    else:
        fields["files"] = {"MLX_IBV_DEVICES": json.dumps(MESH3)}
        fields["env"] = {"MLX_JACCL_COORDINATOR": "10.0.0.1:5000"}
    return RankJob(**{**fields, **kw})


def test_ring_writes_the_hostfile_and_sets_rank(tmp_path: Path) -> None:
    env = job_env(job("ring"), tmp_path)
    assert env["MLX_RANK"] == "1"
    assert json.loads(Path(env["MLX_HOSTFILE"]).read_text()) == [
        ["10.0.0.0:5000"],
        ["10.0.0.1:5000"],
        ["10.0.0.2:5000"],
    ]
    assert Path(env["MLX_HOSTFILE"]).parent == tmp_path
    assert "MLX_JACCL_RING" not in env


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_jaccl_writes_the_device_matrix_and_coordinator(tmp_path: Path, backend: str) -> None:
    env = job_env(job(backend, env={"MLX_JACCL_COORDINATOR": "10.0.0.1:5000", "X": "y"}), tmp_path)
    assert json.loads(Path(env["MLX_IBV_DEVICES"]).read_text()) == MESH3
    assert env["MLX_JACCL_COORDINATOR"] == "10.0.0.1:5000"
    assert env["MLX_RANK"] == "1" and env["X"] == "y"
    assert env.get("MLX_JACCL_RING") == ("1" if backend == "jaccl-ring" else None)


def test_jaccl_ring_needs_only_neighbours(tmp_path: Path) -> None:
    four = [
        [None if i == j else (f"rdma_en{i}{j}" if abs(i - j) in (1, 3) else None) for j in range(4)]
        for i in range(4)
    ]
    ring = job("jaccl-ring", rank=0, n=4, files={"MLX_IBV_DEVICES": json.dumps(four)})
    assert "MLX_IBV_DEVICES" in job_env(ring, tmp_path)
    with pytest.raises(InputError, match="no RDMA device from rank 0 to ranks \\[2\\]"):
        job_env(job("jaccl", rank=0, n=4, files={"MLX_IBV_DEVICES": json.dumps(four)}), tmp_path)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"backend": "mpi"}, "unknown backend 'mpi'"),
        ({"rank": 3}, "rank 3 of world size 3"),
        ({"env": {"MLX_RANK": "0"}}, "MLX_RANK=0 but the job is rank 1"),
        ({"files": {}}, "lacks MLX_HOSTFILE"),
        ({"files": {"MLX_HOSTFILE": '[["a:1"]]'}}, "must list 3 non-empty lists"),
        ({"files": {"MLX_HOSTFILE": "{"}}, "MLX_HOSTFILE is not valid JSON"),
    ],
)
def test_ring_job_mistakes_are_one_line(tmp_path: Path, bad: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        job_env(replace(job("ring"), **bad), tmp_path)


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ([[None, "a"], ["b", None]], "3x3 matrix"),
        ([["x", "a", "b"], ["a", None, "c"], ["b", "c", None]], "null on its diagonal"),
        ([[None, None, "b"], ["a", None, "c"], ["b", "c", None]], "from rank 0 to ranks \\[1\\]"),
    ],
)
def test_jaccl_matrix_mistakes_are_one_line(tmp_path: Path, matrix: list, message: str) -> None:
    with pytest.raises(InputError, match=message):
        job_env(job("jaccl", rank=0, files={"MLX_IBV_DEVICES": json.dumps(matrix)}), tmp_path)
    with pytest.raises(InputError, match="lacks MLX_JACCL_COORDINATOR"):
        job_env(job("jaccl", env={}), tmp_path)


def test_environment_is_set_for_init_and_its_files_removed_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("MLX_RANK", "MLX_HOSTFILE"):
        monkeypatch.delenv(name, raising=False)
    with job_environment(job("ring")) as env:
        path = Path(os.environ["MLX_HOSTFILE"])
        assert env["MLX_HOSTFILE"] == str(path) and path.is_file()
        assert os.environ["MLX_RANK"] == "1"
        assert path.parent.name.startswith("mlx-cluster-rank1-")
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"  # private
    assert not path.parent.exists()
    # no variable is left naming the deleted file; the job's plain env stays for later reads
    assert "MLX_HOSTFILE" not in os.environ and os.environ["MLX_RANK"] == "1"


def test_single_rank_needs_no_backend(tmp_path: Path) -> None:
    assert (
        job_env(RankJob(rank=0, world_size=1, backend="", strategy="tensor", model="m"), tmp_path)
        == {}
    )
