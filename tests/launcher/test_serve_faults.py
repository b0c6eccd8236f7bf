"""No request takes `mlx-cluster serve` down, with default flags: a seed MLX cannot take, a prompt
far past the model's context and a body nested to the bottom get 400s naming the limit, and
`--local 1` answers normally after them; /health is not 200 while the only rank cannot answer,
and a lost last rank is restarted (never dropped from the plan) until serving resumes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import openai
import pytest
from launch_helpers import tiny_model
from serve_helpers import Server, reference, serving

__all__ = ["tiny_model"]

PROMPT = "Hello world"
CONTEXT = 4096  # tiny-model's max_position_embeddings
UNRESPONSIVE_WITHIN_S = 5.0
RECOVER_WITHIN_S = 120.0


def _post(s: Server, body: object) -> tuple[int, dict[str, object]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return s.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})


def _error(answer: tuple[int, dict[str, object]]) -> tuple[int, dict[str, str]]:
    status, body = answer
    error = body["error"]
    assert isinstance(error, dict), body
    return status, error


def test_hostile_requests_get_400_and_the_single_rank_keeps_serving(tiny_model: Path) -> None:
    ref = reference(tiny_model, 8, prompt=PROMPT)
    with serving("--local", "1", "--model", str(tiny_model)) as s:
        s.wait_ready()
        base = {"model": "m", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        status, error = _error(_post(s, {**base, "seed": 2**64}))
        assert (status, error["param"]) == (400, "seed") and "9223372036854775807" in error[
            "message"
        ]
        status, body = _post(s, {**base, "seed": 2**63 - 1, "temperature": 1})
        assert status == 200, body
        # ~300 KB of text: far past the context, well under the body limit.
        status, error = _error(_post(s, {**base, "prompt": "the cluster " * 25_000}))
        assert status == 400 and error["code"] == "context_length_exceeded", error
        assert f"this model's context is {CONTEXT}" in error["message"]
        status, error = _error(_post(s, {**base, "max_tokens": CONTEXT}))
        assert status == 400 and "ask for at most" in error["message"], error
        status, error = _error(_post(s, b"[" * 100_000))
        assert status == 400 and "nested too deeply" in error["message"], error
        assert s.health()[0] == 200
        out = s.client().completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0)
        assert out.choices[0].text == ref.text
        # Without max_tokens a chat answer may run to the end of the context: it is not refused.
        chat = s.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], temperature=0
        )
        assert chat.choices[0].finish_reason in ("stop", "length")
        assert "Traceback" not in s.stderr


def test_health_drops_while_the_rank_cannot_answer_and_the_last_rank_is_restarted(
    tiny_model: Path,
) -> None:
    ref = reference(tiny_model, 8, prompt=PROMPT)
    with serving("--local", "1", "--model", str(tiny_model)) as s:
        s.wait_ready()
        pid = s.ranks(1)[0]
        os.kill(pid, signal.SIGSTOP)  # alive but frozen: nothing can be answered
        stopped_at = time.monotonic()
        body = s.wait_health(False, UNRESPONSIVE_WITHIN_S + 1)
        assert time.monotonic() - stopped_at < UNRESPONSIVE_WITHIN_S, body
        assert s.wait_health(True, RECOVER_WITHIN_S, every_s=0.5)["ranks"] == 1
        assert "restarting on the same hosts in" in s.stderr
        out = s.client().completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0)
        assert out.choices[0].text == ref.text
        # Killed outright: restarted again, never dropped.
        os.kill(s.ranks(1)[0], signal.SIGKILL)
        s.wait_health(False, 10)
        with pytest.raises(openai.InternalServerError) as caught:
            s.client().completions.create(model="m", prompt=PROMPT, max_tokens=2)
        assert caught.value.status_code == 503
        s.wait_health(True, RECOVER_WITHIN_S, every_s=0.5)
        out = s.client().completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0)
        assert out.choices[0].text == ref.text
        assert "no plan fits" not in s.stderr
