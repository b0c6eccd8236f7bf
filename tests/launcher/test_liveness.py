"""The liveness rules on their own (launcher/ranks/liveness.py): which failure a set of last-heard
times means, and the progress deadline learned from the job's pace. The real thing is tested
on real ranks (test_supervisor.py) and emulated hosts (tests/hosts/test_multihost.py)."""

from __future__ import annotations

from launcher.ranks.liveness import Deadlines, Liveness, overdue

HOSTS = ["h0", "h1", "h2"]
D = Deadlines()


def _clock(now: float) -> Liveness:
    """Three loaded ranks, every rank and guard heard just now."""
    clock = Liveness.start(3, now)
    for r in range(3):
        clock.heard(r, {"event": "decode"}, now)
        clock.heard(r, {"event": "guard"}, now)
    return clock


def test_a_quiet_rank_on_a_live_host_is_stopped_or_hung() -> None:
    clock = _clock(0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 5.5):
        for r in range(3):
            clock.heard(r, {"event": "guard"}, t)
        for r in (0, 1):
            clock.heard(r, {"event": "heartbeat"}, t)
    clock.heard(0, {"event": "progress", "stage": "decode"}, 5.5)
    blamed = overdue(clock, D, [0, 1, 2], HOSTS, 5.6)
    assert blamed == (2, "sent nothing for 5.6 s while its host still answers (stopped or hung)")


def test_a_host_gone_quiet_is_named_as_the_host_even_when_its_guard_spoke_last() -> None:
    clock = _clock(0.0)
    clock.heard(2, {"event": "guard"}, 0.9)  # the guard's last word came after the rank's
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 5.5, 6.0):
        for r in (0, 1):
            clock.heard(r, {"event": "heartbeat"}, t)
            clock.heard(r, {"event": "guard"}, t)
    assert overdue(clock, D, [0, 1, 2], HOSTS, 5.5) is None  # not "still answers": it doesn't
    blamed = overdue(clock, D, [0, 1, 2], HOSTS, 6.0)
    assert blamed is not None and blamed[0] == 2 and "stopped answering for 5.1 s" in blamed[1]


def test_a_link_down_between_two_live_hosts_names_both_ends() -> None:
    clock = _clock(0.0)
    down = {"event": "link_down", "peer": 2, "addr": "10.0.12.1", "peer_addr": "10.0.12.2"}
    clock.heard(1, down, 3.0)
    for r in range(3):
        clock.heard(r, {"event": "guard"}, 3.5)
        clock.heard(r, {"event": "heartbeat"}, 3.5)
    assert overdue(clock, D, [0, 1, 2], HOSTS, 3.5) is None  # not confirmed yet
    blamed = overdue(clock, D, [0, 1, 2], HOSTS, 4.1)
    assert blamed is not None and blamed[0] == 1
    assert "lost its link to rank 2 on h2 (10.0.12.1 ↔ 10.0.12.2)" in blamed[1]


def test_slow_steps_raise_the_progress_allowance() -> None:
    clock = _clock(0.0)
    step = {"event": "progress", "stage": "decode"}
    for t in (60.0, 80.0, 100.0):  # a 60 s prefill chunk, then 20 s decode steps
        clock.heard(0, step, t)
    assert clock.stall_allowance(D) == 240.0  # 4 × the longest pause, above the 120 s floor
    for t in range(101, 342):  # alive all along, no progress
        for r in range(3):
            clock.heard(r, {"event": "heartbeat"}, float(t))
            clock.heard(r, {"event": "guard"}, float(t))
    assert overdue(clock, D, [0, 1, 2], HOSTS, 330.0) is None
    blamed = overdue(clock, D, [0, 1, 2], HOSTS, 341.0)
    assert blamed is not None and "made no progress for 241.0 s" in blamed[1]
