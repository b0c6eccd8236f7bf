"""`mlx-cluster serve` with real local ranks, spoken to by the official `openai` client and raw
http.client: answers equal plain mlx-lm in one process, bad input gets OpenAI error objects,
and a rank SIGKILLed mid-request fails that request fast, then serving resumes re-planned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from launch_helpers import MLX_CLUSTER, tiny_model
from serve_helpers import Server, StreamInBackground, reference, serving

from cluster.tiny_model import write_tiny_model

__all__ = ["tiny_model"]  # the fixture (4 heads / 2 KV heads: tensor over 1 or 2 ranks)

KEY = "test-key-123"
PROMPT = "Hello world"
ENUM_SCHEMA = {
    "type": "object",
    "properties": {"mood": {"enum": ["calm", "stormy"]}},
    "required": ["mood"],
    "additionalProperties": False,
}
FAIL_WITHIN_S = 10.0  # the promise for a request in flight when a rank dies
RECOVER_WITHIN_S = 120.0


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    args = ["--local", "2", "--strategy", "tensor", "--model", str(tiny_model), "--api-key", KEY]
    with serving(*args) as s:
        s.wait_ready()
        yield s


def test_health_is_200_with_every_rank_up(server: Server) -> None:
    status, body = server.health()  # no key needed: load balancers probe it
    assert status == 200, body
    assert (body["status"], body["ranks"], body["strategy"]) == ("ok", 2, "tensor")


def test_completion_equals_one_process(server: Server, tiny_model: Path) -> None:
    ref = reference(tiny_model, 24, prompt=PROMPT)
    out = server.client(KEY).completions.create(
        model=str(tiny_model), prompt=PROMPT, max_tokens=24, temperature=0
    )
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == ref.finish_reason
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (
        ref.prompt_tokens,
        ref.completion_tokens,
    )
    assert out.usage.total_tokens == ref.prompt_tokens + ref.completion_tokens


def test_chat_streamed_and_not_equal_one_process(server: Server, tiny_model: Path) -> None:
    ref = reference(tiny_model, 30, chat=PROMPT)
    client = server.client(KEY)
    messages: Any = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(
        model="any", messages=messages, max_tokens=30, temperature=0
    )
    assert whole.choices[0].message.content == ref.text
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
        ref.prompt_tokens,
        ref.completion_tokens,
    )
    chunks = list(
        client.chat.completions.create(
            model="any",
            messages=messages,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason
    streamed = chunks[-1].usage
    assert streamed is not None and streamed.prompt_tokens_details is not None
    counts = (streamed.prompt_tokens, streamed.completion_tokens, streamed.total_tokens)
    assert counts == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
        whole.usage.total_tokens,
    )
    # The same prompt again: rank 0 may take some of it from its prefix cache.
    assert 0 <= (streamed.prompt_tokens_details.cached_tokens or 0) < ref.prompt_tokens


def test_stop_string_cuts_the_text_and_ends_generation(server: Server, tiny_model: Path) -> None:
    ref = reference(tiny_model, 40, prompt=PROMPT)
    stop = ref.text[12:15]
    expected = ref.text[: ref.text.index(stop)]
    client = server.client(KEY)
    out = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "never appears"]
    )
    assert (out.choices[0].text, out.choices[0].finish_reason) == (expected, "stop")
    assert out.usage is not None and out.usage.completion_tokens < ref.completion_tokens
    streamed = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=40, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_models_lists_the_served_model(server: Server, tiny_model: Path) -> None:
    models = server.client(KEY).models.list()
    assert [m.id for m in models.data] == [str(tiny_model)]


BAD_BODIES = [
    ("/v1/chat/completions", b"not json", None),
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/chat/completions", b"{}", "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "messages"),
    ("/v1/completions", b'{"prompt": "x", "temperature": "hot"}', "temperature"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', "stop"),
    ("/v1/completions", b'{"prompt": "x", "n": 2}', "n"),
    ("/v1/completions", b'{"prompt": ["a", "b"]}', "prompt"),
    ("/v1/completions", b'{"max_tokens": 3}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD_BODIES)
def test_bad_bodies_get_400_error_objects(
    server: Server, path: str, body: bytes, param: str | None
) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    status, answer = server.request("POST", path, body, headers)
    assert status == 400, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


def test_bad_body_through_the_client_is_a_bad_request(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client(KEY).chat.completions.create(model="m", messages=[], max_tokens=3)
    assert caught.value.status_code == 400
    assert server.health()[0] == 200  # the server and ranks are unharmed


def test_api_key_is_enforced(server: Server) -> None:
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong-key").models.list()
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    status, answer = server.request("POST", "/v1/completions", body)  # no key at all
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"


def test_unknown_route_is_404_and_wrong_method_405(server: Server) -> None:
    status, answer = server.request(
        "GET", "/v1/nothing", headers={"Authorization": f"Bearer {KEY}"}
    )
    assert status == 404 and answer["error"]["type"] == "invalid_request_error"
    status, answer = server.request(
        "GET", "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}
    )
    assert status == 405


def _fail_over(s: Server, kill_rank: int, ranks_before: int) -> tuple[float, float]:
    """Kill a rank mid-request; return how long the request and /health took to notice."""
    s.wait_ready()
    assert s.wait_health(True, 10)["ranks"] == ranks_before
    client = s.client()
    stream = StreamInBackground(client, max_tokens=2000)
    assert stream.started.wait(60), s.stderr
    assert stream.error is None, stream.error
    pid = s.ranks(ranks_before)[kill_rank]
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    s.wait_health(False, FAIL_WITHIN_S, every_s=0.05)
    down_after = time.monotonic() - killed_at
    stream.thread.join(FAIL_WITHIN_S + 5)
    assert not stream.thread.is_alive(), "the request in flight never ended"
    assert isinstance(stream.error, openai.APIError), stream.error
    assert "every rank was stopped" in str(stream.error)
    return stream.ended_at - killed_at, down_after


def test_rank_killed_mid_request_fails_it_then_serving_resumes_on_one_rank(
    tiny_model: Path,
) -> None:
    args = ["--local", "2", "--strategy", "tensor", "--model", str(tiny_model)]
    args += ["--max-concurrency", "1", "--max-queue", "0", "--job-option", "token_delay_s=0.1"]
    ref = reference(tiny_model, 16, prompt=PROMPT)
    with serving(*args) as s:
        s.wait_ready()
        busy = StreamInBackground(s.client(), max_tokens=20)
        assert busy.started.wait(60), s.stderr
        with pytest.raises(openai.RateLimitError):  # nothing may wait (--max-queue 0): 429 at once
            s.client().completions.create(model="m", prompt=PROMPT, max_tokens=2)
        busy.thread.join(60)
        assert busy.error is None and not busy.thread.is_alive()
        failed_after, down_after = _fail_over(s, kill_rank=1, ranks_before=2)
        assert failed_after < FAIL_WITHIN_S and down_after < FAIL_WITHIN_S
        assert s.wait_health(True, RECOVER_WITHIN_S, every_s=0.5)["ranks"] == 1
        out = s.client().completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0)
        assert out.choices[0].text == ref.text
        assert "re-planned tensor ×2 → tensor ×1 in" in s.stderr
        assert "serving again" in s.stderr


def test_4_ranks_lose_one_and_re_plan_tensor_x3_uneven_then_serve_a_batch_of_8(
    tmp_path: Path,
) -> None:
    """8 heads / 4 KV heads: 4 ranks hold 2 heads and 1 KV head each; a lost rank re-plans to
    tensor ×3 (before uneven shares it was pipeline), where no even split exists (the plan's
    shares are checked below). On those uneven shares, eight concurrent chats through the
    official client, streamed and whole, all equal one plain mlx-lm process (identical rows of a
    batch); a second turn hits the prefix cache and a json_schema answer is valid."""
    model = write_tiny_model(tmp_path / "kv4", layers=4, hidden=128, heads=8, kv_heads=4)
    plan = [MLX_CLUSTER, "plan", "--local", "3", "--strategy", "tensor", "--model", str(model)]
    planned = subprocess.run(
        [*plan, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    heads = sorted(r["heads"] for r in json.loads(planned.stdout)["ranks"])
    assert sum(heads) == 8 and heads[0] != heads[-1], heads
    args = ["--local", "4", "--strategy", "tensor", "--model", str(model)]
    args += ["--job-option", "token_delay_s=0.1"]
    ref = reference(model, 16, chat=PROMPT)
    messages = [{"role": "user", "content": PROMPT}]
    with serving(*args) as s:
        s.wait_ready()
        out = s.client().chat.completions.create(
            model="m", messages=messages, max_tokens=16, temperature=0
        )
        assert out.choices[0].message.content == ref.text
        failed_after, _ = _fail_over(s, kill_rank=0, ranks_before=4)
        assert failed_after < FAIL_WITHIN_S
        body = s.wait_health(True, RECOVER_WITHIN_S, every_s=0.5)
        assert (body["strategy"], body["ranks"]) == ("tensor", 3)
        assert "re-planned tensor ×4 → tensor ×3 in" in s.stderr
        texts: list[str | None] = [None] * 8

        def chat(i: int) -> None:
            client = s.client()
            if i % 2:
                out = client.chat.completions.create(
                    model="m", messages=messages, max_tokens=16, temperature=0
                )
                texts[i] = out.choices[0].message.content
            else:
                chunks = client.chat.completions.create(
                    model="m", messages=messages, max_tokens=16, temperature=0, stream=True
                )
                texts[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        threads = [threading.Thread(target=chat, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert texts == [ref.text] * 8, s.stderr[-2000:]
        client = s.client()
        # the prefix cache: a second turn starts from the first one's cache, on every rank
        turn2 = [*messages, {"role": "assistant", "content": ref.text}]
        turn2.append({"role": "user", "content": "And the mountains?"})
        hit = client.chat.completions.create(model="m", messages=turn2, max_tokens=8, temperature=0)
        assert hit.usage is not None and hit.usage.prompt_tokens_details is not None
        assert (hit.usage.prompt_tokens_details.cached_tokens or 0) > 0, hit.usage
        # a grammar: every rank samples the same constrained token
        fmt: Any = {
            "type": "json_schema",
            "json_schema": {"name": "o", "schema": ENUM_SCHEMA, "strict": True},
        }
        out = client.chat.completions.create(
            model="m", messages=messages, response_format=fmt, max_tokens=50, temperature=0
        )
        assert json.loads(out.choices[0].message.content or "")["mood"] in ("calm", "stormy")
