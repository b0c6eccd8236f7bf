"""Stopping ranks: SIGTERM first, so a rank can release MLX and its RDMA resources on the way
out; SIGKILL only for those still running after the grace — and the failure says which."""

from __future__ import annotations

import queue
import sys
import time
from pathlib import Path

from cluster.job import RankJob
from launcher.ranks.process import RankLaunch, RankProcess, Report, stop_all
from launcher.ranks.supervisor import Failure

# A stand-in rank: notes every SIGTERM in a file, then exits (or, told to, keeps running).
SCRIPT = """
import os, signal, sys, time
log, ignore = sys.argv[1], sys.argv[2] == "ignore"
def on_term(signum, frame):
    with open(log, "a") as f:
        f.write("TERM\\n")
    if not ignore:
        sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
with open(log, "a") as f:
    f.write("up\\n")
while True:
    time.sleep(0.05)
"""
GRACE_S = 1.5


def _rank(rank: int, log: Path, mode: str, reports: queue.Queue[Report]) -> RankProcess:
    argv = (sys.executable, "-c", SCRIPT, str(log), mode)
    job = RankJob(rank=rank, world_size=2, backend="ring", strategy="tensor", model="m")
    return RankProcess(RankLaunch(rank, f"h{rank}", argv, job), reports)


def test_sigterm_then_sigkill_after_the_grace_for_a_rank_that_ignores_it(tmp_path: Path) -> None:
    reports: queue.Queue[Report] = queue.Queue()
    logs = [tmp_path / "r0.log", tmp_path / "r1.log"]
    ranks = [_rank(0, logs[0], "exit", reports), _rank(1, logs[1], "ignore", reports)]
    end = time.monotonic() + 30
    while not all(p.exists() and "up" in p.read_text() for p in logs):
        assert time.monotonic() < end, "the stand-in ranks did not start"
        time.sleep(0.05)
    started = time.monotonic()
    killed = stop_all(ranks, GRACE_S)
    elapsed = time.monotonic() - started
    assert [r.launch.rank for r in killed] == [1]
    assert [p.read_text().split() for p in logs] == [["up", "TERM"], ["up", "TERM"]]
    assert ranks[0].returncode == 143  # it took SIGTERM and went
    assert ranks[1].returncode == -9  # SIGKILL, only after the grace
    assert GRACE_S <= elapsed < GRACE_S + 3


def test_the_failure_names_the_ranks_that_needed_sigkill() -> None:
    failure = Failure(0, "h0", "sent nothing for 5.2 s (stopped or hung)", killed=("rank 1 on h1",))
    assert failure.message() == (
        "rank 0 on h0 sent nothing for 5.2 s (stopped or hung); every rank was stopped "
        "(rank 1 on h1 only by SIGKILL, after the SIGTERM grace)"
    )
