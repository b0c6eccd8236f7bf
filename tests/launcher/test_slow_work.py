"""Slow work is not a failure, with default flags: ranks whose prefill chunk takes 60 s and whose
decode steps take 20 s (made slow through job options; their heartbeats keep running) finish
under `launch` and are served under `serve`, with no failover. Both run at once: they sleep."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from launch_helpers import PROMPT, launched, tiny_model
from serve_helpers import serving

__all__ = ["tiny_model"]
pytestmark = pytest.mark.sleeps  # scripts/check runs it beside the workers, not on one

SLOW = ["--job-option", "prompt_delay_s=60", "--job-option", "token_delay_s=20"]
MAX_TOKENS = 2  # one 60 s prefill chunk, then two 20 s decode steps


def test_a_60s_prefill_chunk_and_20s_decode_steps_complete_under_launch_and_serve(
    tiny_model: Path,
) -> None:
    answer: dict[str, object] = {}
    with serving("--local", "2", "--model", str(tiny_model), *SLOW) as server:
        server.wait_ready()

        def ask() -> None:
            try:
                out = (
                    server.client()
                    .with_options(timeout=300)
                    .completions.create(
                        model="m", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
                    )
                )
                answer["tokens"] = out.usage.completion_tokens if out.usage else None
            except Exception as e:  # reported below
                answer["error"] = e

        asking = threading.Thread(target=ask)
        asking.start()
        args = ["--local", "2", "--model", str(tiny_model), "--prompt", PROMPT, *SLOW]
        with launched(*args, "--max-tokens", str(MAX_TOKENS), "--json") as run:
            code = run.wait(300)
            assert code == 0, run.stderr
            assert "no progress" not in run.stderr and "sent nothing" not in run.stderr
        asking.join(300)
        assert answer == {"tokens": MAX_TOKENS}, (answer, server.stderr)
        assert server.health()[0] == 200
        assert "re-plan" not in server.stderr and "restarting" not in server.stderr, server.stderr
