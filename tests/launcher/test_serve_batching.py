"""The batching engine behind the real `mlx-cluster serve`, through the official `openai`
client: a closed stream frees its slot at once, a prefix-cache hit is reported in usage, a long
prompt on a slow machine is work and not a hang (default flags), and a rank SIGKILLed under a
batch of 8 ends every request fast, then serving resumes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import openai
from launch_helpers import tiny_model
from serve_helpers import serving

from cluster.tiny_model import write_tiny_model

__all__ = ["tiny_model"]

FAIL_WITHIN_S = 10.0
RECOVER_WITHIN_S = 120.0
LONG_CHAT = [{"role": "user", "content": "Hello world"}]  # tiny models talk for 150+ tokens


def _chat_text(client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int) -> str:
    out = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
    )
    return out.choices[0].message.content or ""


def test_a_closed_stream_frees_its_slot(tiny_model: Path) -> None:
    """One sequence at a time: the next request must not wait out the abandoned one's
    max_tokens (2,000 tokens at 0.1 s a step would be minutes)."""
    args = ["--local", "2", "--model", str(tiny_model), "--max-concurrency", "1"]
    with serving(*args, "--job-option", "token_delay_s=0.1") as s:
        s.wait_ready()
        client = s.client()
        stream = client.chat.completions.create(
            model="m",
            messages=LONG_CHAT,
            max_tokens=2000,
            temperature=0,
            stream=True,
        )
        for n, _chunk in enumerate(stream):
            if n == 3:
                break
        stream.close()  # the client goes away mid-answer
        closed = time.monotonic()
        out = client.completions.create(model="m", prompt="Hi", max_tokens=4, temperature=0)
        waited = time.monotonic() - closed
        assert out.choices[0].finish_reason in ("length", "stop")
        assert waited < 15, f"the next request waited {waited:.1f} s: the slot was not freed"
        assert "Traceback" not in s.stderr


def test_a_second_chat_turn_reuses_the_first_and_says_so(tiny_model: Path) -> None:
    system = {"role": "system", "content": "You answer briefly about seas and mountains. " * 12}
    turn1 = [system, {"role": "user", "content": "Tell me about the sea"}]
    with serving("--local", "2", "--model", str(tiny_model)) as s:
        s.wait_ready()
        client = s.client()
        answer = _chat_text(client, turn1, 24)
        turn2 = [*turn1, {"role": "assistant", "content": answer}]
        turn2.append({"role": "user", "content": "And the mountains?"})
        hit = client.chat.completions.create(
            model="m",
            messages=turn2,
            max_tokens=24,
            temperature=0,
        )
        assert hit.usage is not None and hit.usage.prompt_tokens_details is not None
        cached = hit.usage.prompt_tokens_details.cached_tokens or 0
        assert cached > hit.usage.prompt_tokens // 2, hit.usage
    with serving("--local", "2", "--model", str(tiny_model)) as fresh:  # an empty cache
        fresh.wait_ready()
        miss = fresh.client().chat.completions.create(
            model="m",
            messages=turn2,
            max_tokens=24,
            temperature=0,
        )
        assert miss.usage is not None and miss.usage.prompt_tokens_details is not None
        assert not miss.usage.prompt_tokens_details.cached_tokens
    assert hit.choices[0].message.content == miss.choices[0].message.content


def test_a_long_prompt_on_a_slow_machine_is_not_a_failure(tmp_path: Path) -> None:
    """1,500 prompt tokens on an 8-layer hidden-1024 model: one 512-token chunk takes longer
    than serve's --rank-timeout here. With default flags nothing fails over."""
    model = write_tiny_model(tmp_path / "wide", layers=8, hidden=1024, heads=8, kv_heads=4)
    ids = [(i * 37) % 250 + 3 for i in range(1500)]
    with serving("--local", "2", "--model", str(model)) as s:
        s.wait_ready()
        client = openai.OpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=600)
        out = client.completions.create(model="m", prompt=ids, max_tokens=4, temperature=0)
        assert out.usage is not None and out.usage.prompt_tokens == 1500
        assert s.health()[0] == 200
        assert "re-planning" not in s.stderr and "died" not in s.stderr, s.stderr


class Requests:
    """n chats read by threads, every other one streamed; each records its error and when it
    ended. A streamed one has started at its first chunk; a whole one once it was sent."""

    def __init__(self, client: openai.OpenAI, n: int) -> None:
        self.started = [threading.Event() for _ in range(n)]
        self.errors: list[Exception | None] = [None] * n
        self.ended = [0.0] * n
        self.threads = [threading.Thread(target=self._run, args=(client, i)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, client: openai.OpenAI, i: int) -> None:
        messages = [{"role": "user", "content": f"Hello world number {i}"}]
        stream = i % 2 == 0
        try:
            if not stream:
                self.started[i].set()
            answer = client.chat.completions.create(
                model="m", messages=messages, max_tokens=2000, temperature=0, stream=stream
            )
            for _chunk in answer if stream else ():
                self.started[i].set()
        except Exception as e:
            self.errors[i] = e
        self.ended[i] = time.monotonic()
        self.started[i].set()


def test_a_rank_killed_under_a_batch_of_8_ends_every_request_then_serving_resumes(
    tiny_model: Path,
) -> None:
    with serving(
        "--local", "2", "--model", str(tiny_model), "--job-option", "token_delay_s=0.1"
    ) as s:
        s.wait_ready()
        inflight = Requests(s.client(), 8)
        for started in inflight.started:
            assert started.wait(90), s.stderr
        assert all(e is None for e in inflight.errors), inflight.errors
        os.kill(s.ranks(2)[1], signal.SIGKILL)
        killed = time.monotonic()
        for t in inflight.threads:
            t.join(FAIL_WITHIN_S + 5)
        assert not any(t.is_alive() for t in inflight.threads), "a request never ended"
        assert all(isinstance(e, openai.APIError) for e in inflight.errors), inflight.errors
        whole = [e for i, e in enumerate(inflight.errors) if i % 2]  # 503 bodies, not hangs
        assert all(isinstance(e, openai.InternalServerError) for e in whole), whole
        assert all(e.status_code == 503 for e in whole if isinstance(e, openai.APIStatusError))
        assert max(inflight.ended) - killed < FAIL_WITHIN_S
        assert s.wait_health(True, RECOVER_WITHIN_S, every_s=0.5)["ranks"] == 1
        out = s.client().completions.create(model="m", prompt="Hi", max_tokens=4, temperature=0)
        assert out.choices[0].text is not None
