"""Run the real `mlx-cluster serve` in a subprocess; talk to it over HTTP; compare with mlx-lm.

Like launch_helpers, each server carries a unique marker in its environment so a /proc scan
finds exactly its ranks. Every wait is bounded; `stop()` always ends the server and its ranks.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import openai
from launch_helpers import CliProcess, rank_pids

READY_TIMEOUT_S = 120.0  # imports + loading on a busy 2-core machine


class Server(CliProcess):
    """A running `mlx-cluster serve ... --port 0`."""

    def __init__(self, *args: str) -> None:
        super().__init__("serve", "--port", "0", *args)
        self.url = ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The base URL (…/v1) from the ready line."""
        end = time.monotonic() + timeout_s
        while not (found := re.search(r"at (http://\S+/v1) ", self.stdout)):
            assert self.proc.poll() is None, f"serve exited:\n{self.stdout}\n{self.stderr}"
            assert time.monotonic() < end, f"not ready within {timeout_s} s:\n{self.stderr}"
            time.sleep(0.1)
        self.url = found.group(1)
        return self.url

    def wait_listening(self, timeout_s: float = 60.0) -> str:
        """The base URL from the log line serve writes before the ranks have loaded."""
        end = time.monotonic() + timeout_s
        while not (found := re.search(r"listening on (http://\S+/v1);", self.stderr)):
            assert self.proc.poll() is None, f"serve exited:\n{self.stderr}"
            assert time.monotonic() < end, f"not listening within {timeout_s} s:\n{self.stderr}"
            time.sleep(0.05)
        self.url = found.group(1)
        return self.url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0])

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A raw HTTP request (no client library): status and the JSON body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            conn.close()

    def health(self) -> tuple[int, dict[str, Any]]:
        return self.request("GET", "/health")

    def wait_health(self, ok: bool, timeout_s: float, every_s: float = 0.1) -> dict[str, Any]:
        end = time.monotonic() + timeout_s
        while True:
            status, body = self.health()
            if (status == 200) == ok:
                return body
            assert time.monotonic() < end, f"/health still {status} {body}:\n{self.stderr}"
            time.sleep(every_s)

    def wait_open(self, n: int, timeout_s: float) -> float:
        """Wait until /health counts n open requests; the seconds it took."""
        start = time.monotonic()
        while (body := self.health()[1]).get("open_requests") != n:
            assert time.monotonic() - start < timeout_s, f"open requests: {body}\n{self.stderr}"
            time.sleep(0.02)
        return time.monotonic() - start

    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=api_key, max_retries=0, timeout=180)

    def stop(self) -> int | None:
        """SIGTERM, as a service manager would; SIGKILL if it does not end in time."""
        code = None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for t in self._readers:
            t.join(5.0)
        return code

    def leftover_ranks(self, settle_s: float = 5.0) -> dict[int, int]:
        end = time.monotonic() + settle_s
        while (left := rank_pids(self.marker)) and time.monotonic() < end:
            time.sleep(0.1)
        for pid in left.values():  # never leave them behind, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left


class StreamInBackground:
    """A streamed chat completion read by a thread: when it started and how it ended. (The
    chat prompt makes both tiny models talk for 150+ tokens before their end-of-turn.)"""

    def __init__(self, client: openai.OpenAI, max_tokens: int, prompt: str = "Hello world") -> None:
        self.started = threading.Event()
        self.error: Exception | None = None
        self.ended_at = 0.0
        self.text = ""
        self._client, self._max_tokens, self._prompt = client, max_tokens, prompt
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for chunk in self._client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": self._prompt}],
                max_tokens=self._max_tokens,
                temperature=0,
                stream=True,
            ):
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
                if self.text:
                    self.started.set()
        except Exception as e:
            self.error = e
        self.ended_at = time.monotonic()
        self.started.set()


@contextlib.contextmanager
def serving(*args: str) -> Iterator[Server]:
    server = Server(*args)
    try:
        yield server
    finally:
        code = server.stop()
        assert server.leftover_ranks() == {}, "serve left ranks behind"
        assert code == 0, f"serve exited {code} on SIGTERM:\n{server.stderr}"


@dataclass(frozen=True)
class Reference:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


@cache
def _loaded(model_dir: str) -> tuple[Any, Any]:
    from mlx_lm import load

    return load(model_dir)


def reference(model_dir: Path, max_tokens: int, prompt: str = "", chat: str = "") -> Reference:
    """Plain mlx-lm in this process, greedy: a raw prompt as mlx_lm.generate encodes it, or one
    user message through the chat template."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = _loaded(str(model_dir))
    if chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": chat}], add_generation_prompt=True
        )
    else:
        ids = tokenizer.encode(prompt)
    text, last = "", None
    for last in stream_generate(
        model, tokenizer, mx.array(ids), max_tokens=max_tokens, sampler=make_sampler(0.0)
    ):
        text += last.text
    assert last is not None
    stopped = last.finish_reason == "stop"  # the end-of-turn token is not generated text
    return Reference(text, len(ids), last.generation_tokens - stopped, str(last.finish_reason))
