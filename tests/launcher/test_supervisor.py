"""Supervision with real ranks: a failing, killed, stopped rank or Ctrl-C stops every rank.

Each test runs `mlx-cluster launch --local 2` on a tiny model, slowed down per token (the
rank's `token_delay_s` job option) so there is time to act mid-decode, and asserts: the time
from the act to the launcher's exit, a non-zero exit naming the rank, and no rank left alive.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from launch_helpers import PROMPT, launched, rank_pids, tiny_model

__all__ = ["tiny_model"]  # the fixture

STOP_WITHIN_S = 5.0  # the supervisor's promise after a rank dies
SLACK_S = 2.0  # a loaded 2-core machine


def slow_launch_args(model: Path, *extra: str) -> list[str]:
    return [
        "--local", "2", "--strategy", "tensor", "--model", str(model), "--prompt", PROMPT,
        "--max-tokens", "150", "--job-option", "token_delay_s=0.1", *extra,
    ]  # fmt: skip


def test_rank_killed_mid_decode_stops_every_rank(tiny_model: Path) -> None:
    with launched(*slow_launch_args(tiny_model)) as run:
        run.wait_for_text()
        pids = run.ranks(2)
        os.kill(pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        code = run.wait()
        elapsed = time.monotonic() - killed_at
        assert code == 1, run.stderr
        assert elapsed < STOP_WITHIN_S + SLACK_S, f"took {elapsed:.1f} s"
        assert "rank 1 on localhost was killed by SIGKILL" in run.stderr
        assert run.leftover_ranks() == {}


def test_rank_error_stops_every_rank_and_is_named(tiny_model: Path) -> None:
    fail = 'fail_at_token={"rank": 1, "token": 3}'
    with launched(*slow_launch_args(tiny_model, "--job-option", fail)) as run:
        code = run.wait()
        assert code == 1, run.stderr
        lines = run.stderr.strip().splitlines()
        assert lines[0].startswith("mlx-cluster: error: rank 1 on localhost exited with code 1")
        assert "fail_at_token" in lines[0]
        assert "Traceback" not in run.stderr
        assert run.leftover_ranks() == {}


def test_stopped_rank_is_caught_by_the_heartbeat_deadline_with_default_flags(
    tiny_model: Path,
) -> None:
    with launched(*slow_launch_args(tiny_model)) as run:
        run.wait_for_text()
        pids = run.ranks(2)
        os.kill(pids[1], signal.SIGSTOP)  # rank 0 now waits in a collective forever
        stopped_at = time.monotonic()
        code = run.wait()
        elapsed = time.monotonic() - stopped_at
        assert code == 1, run.stderr
        # Not before the 5 s silence deadline (nothing else would have stopped it), within 10 s.
        assert 4.0 < elapsed < 10.0, f"took {elapsed:.1f} s"
        assert "rank 1 on localhost sent nothing for" in run.stderr
        assert "while its host still answers (stopped or hung)" in run.stderr
        assert run.leftover_ranks() == {}


def test_no_progress_with_live_heartbeats_is_caught(tiny_model: Path) -> None:
    """Like a jaccl collective whose peer vanished: alive, heartbeating, but no token comes."""
    args = slow_launch_args(tiny_model, "--stall-timeout", "5")
    args[args.index("token_delay_s=0.1")] = "token_delay_s=60"  # every rank sleeps per token
    started = time.monotonic()
    with launched(*args) as run:
        code = run.wait()
        elapsed = time.monotonic() - started
        assert code == 1, run.stderr
        # Loading takes a few seconds; without the deadline the first sleep alone lasts 60 s.
        assert elapsed < 40, f"took {elapsed:.1f} s"
        assert "made no progress for" in run.stderr
        assert run.leftover_ranks() == {}


def test_ctrl_c_stops_every_rank(tiny_model: Path) -> None:
    with launched(*slow_launch_args(tiny_model)) as run:
        run.wait_for_text()
        assert len(run.ranks(2)) == 2
        run.proc.send_signal(signal.SIGINT)
        sent_at = time.monotonic()
        code = run.wait()
        assert time.monotonic() - sent_at < STOP_WITHIN_S + SLACK_S
        assert code == 130, run.stderr
        assert "interrupted" in run.stderr
        assert run.leftover_ranks() == {}


def test_launcher_killed_leaves_no_rank(tiny_model: Path) -> None:
    """SIGKILL cannot be caught: the ranks notice stdin EOF and exit by themselves."""
    with launched(*slow_launch_args(tiny_model)) as run:
        run.wait_for_text()
        assert len(run.ranks(2)) == 2
        run.proc.kill()
        run.wait()
        end = time.monotonic() + STOP_WITHIN_S + SLACK_S
        while rank_pids(run.marker) and time.monotonic() < end:
            time.sleep(0.1)
        assert rank_pids(run.marker) == {}
