"""Each rank's environment and files are exactly what mlx.launch itself would give it.

The reference is the installed mlx.launch, run for real on a hostfile whose hosts are all
127.0.0.1 (it runs those locally, without ssh) with a command that prints what it received.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.ranks.jobs import DEFAULT_PORT, Generation, build_rank_jobs
from topology.errors import InputError

MLX_LAUNCH = str(Path(sys.executable).parent / "mlx.launch")
SHOW = (
    "import json, os\n"
    "def read(n):\n"
    "    p = os.environ.get(n)\n"
    "    return json.loads(open(p).read()) if p and open(p).read().strip() else None\n"
    "keys = ['MLX_RANK', 'MLX_JACCL_COORDINATOR', 'MLX_JACCL_RING', 'DEMO_SETTING']\n"
    "env = {k: os.environ[k] for k in keys if k in os.environ}\n"
    "print(json.dumps({'env': env, 'MLX_HOSTFILE': read('MLX_HOSTFILE'),"
    " 'MLX_IBV_DEVICES': read('MLX_IBV_DEVICES')}), flush=True)\n"
)


def mlx_launch_view(hostfile: dict[str, Any], tmp: Path) -> dict[int, dict[str, Any]]:
    """What every rank sees under mlx.launch, by MLX_RANK."""
    path = tmp / "hostfile.json"
    path.write_text(json.dumps(hostfile))
    done = subprocess.run(
        [MLX_LAUNCH, "--hostfile", str(path), "--", sys.executable, "-c", SHOW],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {int(s["env"]["MLX_RANK"]): s for s in seen}


def our_view(hostfile: dict[str, Any]) -> dict[int, dict[str, Any]]:
    jobs = build_rank_jobs(
        hostfile, strategy="tensor", model="m", generation=Generation("hi"), port=DEFAULT_PORT
    )
    keys = ("MLX_RANK", "MLX_JACCL_COORDINATOR", "MLX_JACCL_RING", "DEMO_SETTING")
    return {
        j.rank: {
            "env": {k: v for k, v in j.env.items() if k in keys},
            "MLX_HOSTFILE": json.loads(j.files["MLX_HOSTFILE"])
            if "MLX_HOSTFILE" in j.files
            else None,
            "MLX_IBV_DEVICES": json.loads(j.files["MLX_IBV_DEVICES"])
            if "MLX_IBV_DEVICES" in j.files
            else None,
        }
        for j in jobs
    }


def host(rdma: list[Any]) -> dict[str, Any]:
    return {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": rdma}


HOSTFILES = {
    "ring": {"backend": "ring", "envs": ["DEMO_SETTING=1"], "hosts": [host([]), host([])]},
    "jaccl": {
        "backend": "jaccl",
        "envs": [],
        "hosts": [
            host([None, "rdma_en3", ["rdma_en4", "rdma_en5"]]),
            host(["rdma_en3", None, "rdma_en6"]),
            host([["rdma_en4", "rdma_en5"], "rdma_en6", None]),
        ],
    },
    "jaccl-ring": {
        "backend": "jaccl-ring",
        "envs": ["DEMO_SETTING=x:y"],
        "hosts": [
            host([None, "rdma_en2", None, "rdma_en5"]),
            host(["rdma_en2", None, "rdma_en3", None]),
            host([None, "rdma_en3", None, "rdma_en4"]),
            host(["rdma_en5", None, "rdma_en4", None]),
        ],
    },
}


@pytest.mark.parametrize("backend", sorted(HOSTFILES))
def test_env_and_files_match_mlx_launch(backend: str, tmp_path: Path) -> None:
    hostfile = HOSTFILES[backend]
    theirs = mlx_launch_view(hostfile, tmp_path)
    assert sorted(theirs) == list(range(len(hostfile["hosts"])))
    assert our_view(hostfile) == theirs


def test_local_ports_are_free_and_distinct() -> None:
    hostfile = {"backend": "ring", "envs": [], "hosts": [host([]) for _ in range(4)]}
    jobs = build_rank_jobs(hostfile, strategy="tensor", model="m", generation=Generation("hi"))
    ring = json.loads(jobs[0].files["MLX_HOSTFILE"])
    ports = [int(addrs[0].rsplit(":", 1)[1]) for addrs in ring]
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)
    assert all(j.files == jobs[0].files for j in jobs)


@pytest.mark.parametrize(
    "hostfile",
    [
        {"backend": "jaccl", "hosts": [host([None, "rdma_en3"]), host([None, None])]},
        {"backend": "jaccl", "hosts": [host([None, "rdma_en3"]), host(["rdma_en3"])]},
        {"backend": "ring", "hosts": [host([]), {"ssh": "b", "ips": []}]},
        {"backend": "mpi", "hosts": [host([]), host([])]},
        {"backend": "ring", "hosts": []},
        {"backend": "ring", "envs": ["NOT AN ENV"], "hosts": [host([])]},
        {"backend": "ring", "envs": [3], "hosts": [host([])]},  # not even a string
    ],
)
def test_unusable_hostfile_is_refused(hostfile: dict[str, Any]) -> None:
    with pytest.raises(InputError, match=r"hostfile|env"):
        build_rank_jobs(hostfile, strategy="tensor", model="m", generation=Generation("hi"), port=1)
