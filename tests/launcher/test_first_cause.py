"""When ranks fail together, the one that died first by its cause is named: a rank killed by a
signal before a rank that only saw its peer's socket close, even when the killed rank's exit
reaches the supervisor later (its ssh reports after its neighbours did). Plain processes stand
in for ranks here, so the order of the exits is fixed and the race is the same every run: each
exits at a moment on the wall clock set before both start (a process's own start can lag by
more than the gaps tested when the machine is busy)."""

from __future__ import annotations

import sys
import time

import pytest

from cluster.job import RankJob, event_line
from launcher.ranks.process import RankLaunch
from launcher.ranks.supervisor import EXIT_RANK_FAILED, Deadlines, supervise

SAW_PEER_GO = """
import sys, time
time.sleep(max(0.0, {at!r} - time.time()))
sys.stderr.write({line!r})
sys.exit(1)
"""
KILLED = """
import os, signal, time
time.sleep(max(0.0, {at!r} - time.time()))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _at(offset_s: float) -> float:
    """A moment both processes reach after starting, however slowly: 1.5 s from now."""
    return time.time() + 1.5 + offset_s


def _launch(rank: int, code: str) -> RankLaunch:
    job = RankJob(rank=rank, world_size=2, backend="ring", strategy="tensor", model="m")
    return RankLaunch(rank, f"h{rank}", (sys.executable, "-c", code), job)


@pytest.mark.parametrize("gap_s", [0.0, 0.05, 0.15])
def test_a_killed_rank_is_named_though_its_neighbour_exited_first(gap_s: float) -> None:
    error = event_line(
        "error", rank=0, kind="runtime", stage="decode",
        message="[ring] Socket 3 was closed by the peer",
    )  # fmt: skip
    launches = [
        _launch(0, SAW_PEER_GO.format(at=(start := _at(0.0)), line=error)),
        _launch(1, KILLED.format(at=start + gap_s)),
    ]
    outcome = supervise(launches, on_text=lambda _t: None, deadlines=Deadlines())
    assert outcome.exit_code == EXIT_RANK_FAILED
    assert outcome.failure is not None
    assert outcome.failure.rank == 1, outcome.failure.message()
    assert "rank 1 on h1 was killed by SIGKILL" in outcome.failure.message()


def test_a_rank_that_failed_on_its_own_comes_before_one_that_saw_it_go() -> None:
    own = event_line("error", rank=1, kind="runtime", stage="decode", message="out of memory")
    peer = event_line(
        "error",
        rank=0,
        kind="runtime",
        stage="decode",
        message="[ring] Socket 3 was closed by the peer",
    )
    launches = [
        _launch(0, SAW_PEER_GO.format(at=(start := _at(0.0)), line=peer)),
        _launch(1, SAW_PEER_GO.format(at=start + 0.1, line=own)),
    ]
    outcome = supervise(launches, on_text=lambda _t: None, deadlines=Deadlines())
    assert outcome.failure is not None and outcome.failure.rank == 1, outcome
    assert "out of memory" in outcome.failure.message()
