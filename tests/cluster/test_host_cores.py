"""A host's ranks and their cores (cluster/host_cores.py): which ranks share a host, the block
of cores each keeps to, and a real process kept to its block with the threads it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rankrun import ROOT, Ranks, host_job, ring_jobs
from serving import ServeRanks, request

from cluster import host_cores


def test_ranks_on_this_host_from_the_ring_hostfile() -> None:
    assert host_cores.ranks_on_this_host(host_job(1)) == 1
    assert host_cores.ranks_on_this_host(host_job(4)) == 4  # --local 4: every rank on 127.0.0.1
    spread = ["10.0.0.1", "10.0.0.2", "10.0.0.1"]
    assert host_cores.ranks_here(host_job(3, rank=2, ips=spread)) == [0, 2]
    assert host_cores.ranks_on_this_host(host_job(3, rank=1, ips=spread)) == 1
    assert host_cores.ranks_on_this_host(host_job(2, files={})) is None  # unknown: left as it is
    assert host_cores.ranks_on_this_host(host_job(2, files={"MLX_HOSTFILE": "[[]]"})) is None


@pytest.mark.parametrize(
    ("index", "ranks", "usable", "expected"),
    [
        (0, 2, [0, 1], [0]),  # --local 2 on this 2-core machine
        (1, 2, [0, 1], [1]),
        (1, 2, list(range(8)), [4, 5, 6, 7]),
        (2, 3, list(range(8)), [4, 5]),  # 2 each; core 6 and 7 left to the launcher
        (1, 2, [2, 3, 6, 7], [6, 7]),  # the cores this process may use, not 0..n
        (0, 1, list(range(24)), None),  # a Mac Studio's one rank: nothing to keep apart
        (0, 3, [0, 1], None),  # --local 3 on 2 cores: a core each does not exist
    ],
)
def test_each_rank_gets_an_equal_block_of_its_own(
    index: int, ranks: int, usable: list[int], expected: list[int] | None
) -> None:
    assert host_cores.block(index, ranks, usable) == expected


def test_the_hosts_cores_are_counted_before_the_block() -> None:
    assert host_cores.cores({host_cores.HOST_CORES_ENV: "8"}) == 8
    assert host_cores.cores({}) == len(host_cores.allowed())


def test_left_as_it_was_off_linux_when_off_for_pipelines_or_when_already_in_its_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_cores, "allowed", lambda: [0, 1, 2, 3])
    calls: list[tuple[int, list[int]]] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda t, c: calls.append((t, list(c))))
    assert host_cores.pin(host_job(2, rank=1), {host_cores.CHOICE_ENV: "off"}) is None
    assert host_cores.pin(host_job(2, rank=1), {host_cores.HOST_CORES_ENV: "4"}) is None
    assert host_cores.pin(host_job(1), {}) is None
    assert host_cores.pin(host_job(2, rank=1, strategy="pipeline"), {}) is None
    assert calls == []
    environ: dict[str, str] = {}
    expected = [2, 3] if sys.platform.startswith("linux") else None
    assert host_cores.pin(host_job(2, rank=1), environ) == expected
    if expected:
        assert calls and all(c == [2, 3] for _, c in calls)  # every thread of the process
        assert environ == {host_cores.HOST_CORES_ENV: "4"}


CHILD = """
import json, os, sys, threading
from cluster import host_cores
from cluster.job import RankJob
job = RankJob.from_line(sys.argv[1])
mine = host_cores.pin(job, os.environ)
seen = {}
def look():
    seen["thread"] = sorted(os.sched_getaffinity(0))
t = threading.Thread(target=look); t.start(); t.join()
print(json.dumps({"block": mine, "main": sorted(os.sched_getaffinity(0)), **seen,
                  "cores": host_cores.cores()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux affinity")
def test_a_real_process_and_the_threads_it_starts_keep_to_its_block() -> None:
    usable = host_cores.allowed()
    out = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_CLUSTER_")}
        done = subprocess.run(
            [sys.executable, "-c", CHILD, host_job(2, rank=rank).to_line()],
            env={**env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        out.append(json.loads(done.stdout))
    for rank, seen in enumerate(out):
        expected = host_cores.block(rank, 2, usable)
        assert seen["block"] == expected
        assert seen["main"] == seen["thread"] == (expected or usable)
        assert seen["cores"] == len(usable)  # the host's count, not the block's
    if len(usable) >= 2:
        assert not set(out[0]["main"]) & set(out[1]["main"])  # apart


def _threads_cores(pid: int) -> set[str]:
    """The Cpus_allowed_list of every thread of a process."""
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as f:
            lines = [line for line in f if line.startswith("Cpus_allowed_list")]
        out |= {line.split(":", 1)[1].strip() for line in lines}
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux affinity")
@pytest.mark.parametrize("choice", ["auto", "off"])
def test_serving_ranks_keep_every_thread_to_their_own_cores(
    tiny: Callable[[str], Path], choice: str
) -> None:
    """Two ranks as the launcher starts them, after the BLAS re-execution, serving a request
    (their MLX, BLAS and ring threads all started): each rank's threads share one block, apart
    from the other rank's; MLX_CLUSTER_PIN=off leaves them where they were."""
    model = tiny("llama")
    env = {host_cores.CHOICE_ENV: choice}
    ranks = Ranks(ring_jobs(2, model, "tensor", mode="serve"), env)
    served = ServeRanks(ranks)
    served.line(request("r", [5, 17, 42, 8], 6))
    try:
        assert len(served.done("r")["token_ids"]) == 6
        seen = [_threads_cores(r.proc.pid) for r in ranks.ranks]
    finally:
        ranks.kill()
    usable = host_cores.allowed()
    if choice == "off" or len(usable) < 2:
        whole = {_list(usable)}
        assert seen == [whole, whole]
        return
    assert seen == [{_list(host_cores.block(r, 2, usable) or [])} for r in range(2)]


def _list(cpus: list[int]) -> str:
    """As /proc writes a CPU list: runs as a-b, joined by commas."""
    runs: list[list[int]] = []
    for c in cpus:
        if runs and runs[-1][-1] == c - 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
