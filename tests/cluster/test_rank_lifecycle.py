"""A rank's life outside the happy path: input errors, failures, a stuck peer, a lost launcher."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from rankrun import ROOT, Ranks, ring_jobs, run_ranks

from cluster.job import parse_event
from cluster.load import check_shapes, tensor_share
from cluster.rank_guard import EOF_GRACE_S


def only_error(rank_events: list[dict]) -> dict:
    errors = [e for e in rank_events if e["event"] == "error"]
    assert len(errors) == 1, rank_events
    return errors[0]


def test_heads_that_cannot_split_fail_before_any_forward(tmp_path: Path) -> None:
    """2 query heads cannot go to 3 ranks (uneven shares need one head each at least)."""
    from cluster.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "h2", layers=2, hidden=32, heads=2, kv_heads=1)
    ranks = run_ranks(ring_jobs(3, model, "tensor", prompt="hi", max_tokens=4), timeout=60)
    for rank in ranks:
        error = only_error(rank.events)
        assert rank.proc.returncode == 2
        assert error["kind"] == "input" and error["stage"] == "load"
        assert "needs at least 3 attention heads (the model has 2)" in error["message"]
        assert "--strategy pipeline" in error["message"]
        assert rank.event("decode") is None and rank.event("loading") is None
        assert rank.stderr == []  # one line, no traceback


def test_missing_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    ranks = run_ranks(ring_jobs(1, tmp_path / "nowhere", prompt="hi"), timeout=60)
    error = only_error(ranks[0].events)
    assert ranks[0].proc.returncode == 2 and "not found" in error["message"]
    assert ranks[0].stderr == [] and ranks[0].text == ""


def test_bad_job_line_and_unknown_mode_exit_2(tiny: Callable[[str], Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.rank"],
        input='{"rank": 0, "oops": 1}\n',
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "bad job line" in parse_event(lines[0])["message"]
    job = replace(ring_jobs(1, tiny("llama"))[0], mode="dance")
    ranks = run_ranks([job], timeout=60)
    assert (
        ranks[0].proc.returncode == 2
        and "mode 'dance' is not supported" in only_error(ranks[0].events)["message"]
    )


def test_jaccl_job_reaches_mlx_and_reports_its_failure(tiny: Callable[[str], Path]) -> None:
    """No RDMA here: the env and files are set (see test_rank_env) and MLX's refusal is one line."""
    jobs = ring_jobs(2, tiny("llama"))
    matrix = '[[null, "rdma_en3"], ["rdma_en3", null]]'
    job = replace(
        jobs[0],
        backend="jaccl",
        files={"MLX_IBV_DEVICES": matrix},
        env={"MLX_JACCL_COORDINATOR": "127.0.0.1:1"},
    )
    ranks = run_ranks([job], timeout=60)
    error = only_error(ranks[0].events)
    assert ranks[0].proc.returncode == 1 and error["stage"] == "init"
    assert error["message"].startswith("RuntimeError: jaccl init failed on rank 0")
    assert ranks[0].stderr == []


def test_a_failing_rank_reports_and_its_peer_does_not_hang(tiny: Callable[[str], Path]) -> None:
    """Rank 1 raises at token 3: it names the error, the stage and the place, and exits 1.
    Rank 0 mostly notices the closed sockets itself; but MLX's ring socket thread returns after
    failing the tasks pending at the error (ring.cpp `SocketThread::worker`), so a collective
    already queued behind them waits forever, with the GIL held. Then the launcher's stop (its
    pipe closing) must still end rank 0 within the guard's grace: that is what users rely on."""
    jobs = ring_jobs(
        2,
        tiny("llama"),
        prompt="hi",
        max_tokens=50,
        options={"fail_at_token": {"rank": 1, "token": 3}},
    )
    ranks = Ranks(jobs)
    try:
        r0, r1 = ranks.ranks
        assert r1.proc.wait(30) == 1
        error = only_error(r1.events)
        assert error["stage"] == "decode"
        assert "failing at token 3" in error["message"] and error["where"].startswith(
            "generate.py:"
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            r0.proc.wait(5)
        if r0.proc.returncode is None:  # stuck in MLX: stop it as the launcher does
            assert r0.proc.stdin is not None
            r0.proc.stdin.close()
            closed = time.monotonic()
            r0.proc.wait(EOF_GRACE_S + 5)
            assert time.monotonic() - closed < EOF_GRACE_S + 3
        else:
            assert r0.proc.returncode == 1
            assert "connection" in only_error(r0.events)["message"]
    finally:
        ranks.finish(10)


def test_watchdog_runs_while_the_main_thread_waits_on_a_stopped_peer(
    tiny: Callable[[str], Path],
) -> None:
    """SIGSTOP rank 1 mid-decode: rank 0 blocks in a collective, yet its heartbeat thread keeps
    reporting (with a growing progress age) and it exits as soon as its stdin closes."""
    jobs = ring_jobs(
        2,
        tiny("llama"),
        prompt="hi",
        max_tokens=100000,
        heartbeat_s=0.2,
        options={"token_delay_s": 0.02},
    )
    ranks = Ranks(jobs)
    try:
        r0, r1 = ranks.ranks
        assert ranks.wait_for(lambda: any(e.get("tokens", 0) >= 3 for e in r0.events), 60)
        os.kill(r1.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(2.5)
        beats = [e for e in r0.events if e["event"] == "heartbeat"]
        assert beats[-1]["progress_age_s"] > 1.5  # stuck in the collective...
        assert r0.proc.poll() is None  # ...but alive and beating
        assert len(beats) >= 5
        assert r0.proc.stdin is not None
        r0.proc.stdin.close()  # the launcher is gone
        closed = time.monotonic()
        assert r0.proc.wait(5) == 3
        assert time.monotonic() - closed < 2
        assert time.monotonic() - stopped < 10
    finally:
        for rank in ranks.ranks:
            if rank.proc.poll() is None:
                os.killpg(rank.proc.pid, signal.SIGKILL)
                os.kill(rank.proc.pid, signal.SIGCONT)
        ranks.finish(10)


SHAPE_BASE = {
    "model_type": "llama",
    "vocab_size": 1000,
    "num_hidden_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 2048,
}


@pytest.mark.parametrize(
    ("config", "size", "message"),
    [
        ({}, 9, "at least 9 attention heads (the model has 8)"),
        (
            {"intermediate_size": 128, "quantization": {"group_size": 64, "bits": 4}},
            3,
            "mlp width 128 in at least 3 pieces of 64 columns",
        ),
        (  # 96 columns a head: only every 4th head starts a group of 128
            {"hidden_size": 768, "quantization": {"group_size": 128, "bits": 4}},
            4,
            "attention heads in whole quantization groups of 128 columns (8 heads of 96)",
        ),
    ],
)
def test_tensor_shapes_that_cannot_split_are_refused_before_loading(
    config: dict, size: int, message: str
) -> None:
    from topology.errors import InputError

    shape = {**SHAPE_BASE, **config}
    check_shapes(shape, "tensor", size, None)  # tensor shares are checked when laid out
    whole = f"tensor parallel over {size} ranks needs {message}: use fewer ranks or --strategy"
    for rank in range(size):
        with pytest.raises(InputError, match=whole.replace("(", r"\(").replace(")", r"\)")):
            tensor_share(shape, rank, size, None)


@pytest.mark.parametrize(
    ("config", "size"),
    [  # each refused before uneven shares: now every rank gets a share
        ({"num_attention_heads": 6, "num_key_value_heads": 6}, 4),
        ({"num_key_value_heads": 2}, 4),
        ({"intermediate_size": 300}, 8),
        ({"intermediate_size": 12352, "quantization": {"group_size": 64, "bits": 4}}, 2),
    ],
)
def test_uneven_tensor_shapes_split(config: dict, size: int) -> None:
    shape = {**SHAPE_BASE, **config}
    check_shapes(shape, "tensor", size, None)
    shares = [tensor_share(shape, rank, size, None) for rank in range(size)]
    grid = shares[0][1]
    heads = sorted(h for share, _ in shares for h in share.heads(grid))
    assert heads == list(range(shape["num_attention_heads"]))  # each head on exactly one rank
    spans = [share.widths["mlp"] for share, _ in shares]
    assert spans[0][0] == 0 and spans[-1][1] == shape["intermediate_size"]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert max(e - s for s, e in spans) - min(e - s for s, e in spans) <= 64


def test_a_planned_share_is_checked_against_the_model() -> None:
    from topology.errors import InputError

    given = {"attention": [[0, 2, 0, 1]], "mlp": [0, 1024]}
    share, _ = tensor_share(SHAPE_BASE, 0, 2, given)
    assert (share.blocks, share.widths["mlp"]) == ((((0, 2), (0, 1)),), (0, 1024))
    bad_kv = {**given, "attention": [[6, 9, 0, 1]]}
    for bad in (bad_kv, {**given, "mlp": [0, 4096]}, {**given, "q": [0, 1]}):
        with pytest.raises(InputError, match="re-plan"):
            tensor_share(SHAPE_BASE, 0, 2, bad)


@pytest.mark.parametrize(
    ("config", "strategy", "size", "split", "message"),
    [
        ({}, "pipeline", 4, (2, 2, 2), "must give each of 4 ranks at least one layer"),
        ({}, "pipeline", 2, (0, 4), "at least one layer"),
        ({"num_hidden_layers": 2}, "pipeline", 3, None, "needs at least 3 layers"),
        ({}, "sideways", 2, None, "unknown strategy"),
    ],
)
def test_shapes_are_checked_from_the_config(
    config: dict, strategy: str, size: int, split: tuple[int, ...] | None, message: str
) -> None:
    from topology.errors import InputError

    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_shapes({**SHAPE_BASE, **config}, strategy, size, split)
    check_shapes(SHAPE_BASE, "tensor", 8, None)  # tensor: its shares are checked by tensor_share
    check_shapes(SHAPE_BASE, "pipeline", 4, (1, 1, 1, 1))


def test_empty_prompt_is_refused_by_every_rank_together(tiny: Callable[[str], Path]) -> None:
    jobs = ring_jobs(2, tiny("llama"), prompt="", use_chat_template=False)
    ranks = run_ranks(jobs, timeout=60)
    for rank in ranks:
        assert rank.proc.returncode == 2
        assert "prompt is empty" in only_error(rank.events)["message"]
