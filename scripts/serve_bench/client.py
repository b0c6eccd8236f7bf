"""The client side: streamed chat completions through the official `openai` client (its own
retries counted by cause), and run_round(), c clients at once against one server."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .prompts import Message
from .servers import BenchError, Server
from .stats import RequestResult, RoundResult


class RetryCounter(logging.Handler):
    """Counts the openai client's own retries by cause, from its log: it logs the cause
    ("Encountered ...", DEBUG) and then "Retrying request ..." (INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.causes: dict[str, int] = {}
        self._last = "unknown"

    def emit(self, record: logging.LogRecord) -> None:
        msg, args = record.msg, record.args
        if not isinstance(msg, str):
            return
        if msg.startswith("Encountered") and isinstance(args, tuple) and args:
            self._last = f"HTTP {args[0]}" if "status error" in msg else str(args[0])
        elif msg.startswith("Retrying request"):
            self.causes[self._last] = self.causes.get(self._last, 0) + 1


RETRIES = RetryCounter()


def count_retries() -> None:
    """Route the openai client's log into RETRIES (and nowhere else)."""
    logging.getLogger("openai").addHandler(RETRIES)
    logging.getLogger("openai").setLevel(logging.DEBUG)
    logging.getLogger("openai").propagate = False


def open_client(server: Server, timeout: float, max_retries: int) -> Any:
    """An openai.AsyncOpenAI for this server."""
    import openai

    return openai.AsyncOpenAI(
        base_url=server.base_url, api_key="unused", timeout=timeout, max_retries=max_retries
    )


async def stream_chat(
    client: Any,
    server: Server,
    messages: list[Message],
    max_tokens: int,
    request_kwargs: dict[str, Any],
    t0: float,
    client_index: int,
) -> RequestResult:
    """One streamed chat completion; times taken on the benchmark's side of the socket."""
    import openai

    start = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=server.model,
            messages=messages,
            temperature=0.0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **request_kwargs,
        )
    except openai.RateLimitError:
        now = time.perf_counter()
        return RequestResult(client_index, start - t0, now - t0, None, [], 0, None, None, "", True)
    first: float | None = None
    last: float | None = None
    gaps: list[float] = []
    chunks = 0
    usage: int | None = None
    finish: str | None = None
    text: list[str] = []
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.finish_reason:
                finish = choice.finish_reason
            if choice.delta is not None and choice.delta.content:
                chunks += 1
                text.append(choice.delta.content)
                if first is None:
                    first = now
                if last is not None:
                    gaps.append(now - last)
                last = now
    end = time.perf_counter()
    ttft = None if first is None else first - start
    return RequestResult(
        client_index, start - t0, end - t0, ttft, gaps, chunks, usage, finish, "".join(text)
    )


async def run_round(
    client: Any,
    server: Server,
    conversations: list[list[list[Message]]],
    max_tokens: int,
    request_kwargs: dict[str, Any],
    timeout: float,
    *,
    kind: str = "plain",
    rep: int = 0,
) -> RoundResult:
    """The extension point: one round against one server. `conversations[i]` is client i's list
    of requests (message lists), sent one after the other; all clients start at once.
    `request_kwargs` go into every `chat.completions.create` call as they are, e.g.
    {"response_format": {"type": "json_schema", "json_schema": {...}}} for a structured-output
    round (a RoundKind in workloads/)."""
    server.check_alive()
    RETRIES.causes = {}
    t0 = time.perf_counter()

    async def one_client(i: int) -> list[RequestResult]:
        return [
            await stream_chat(client, server, messages, max_tokens, request_kwargs, t0, i)
            for messages in conversations[i]
        ]

    label = f"{server.name}, {kind} round, {len(conversations)} clients"
    try:  # a TaskGroup: the first failure cancels the other clients and waits for them
        async with asyncio.timeout(timeout), asyncio.TaskGroup() as group:
            tasks = [group.create_task(one_client(i)) for i in range(len(conversations))]
    except TimeoutError:
        raise BenchError(f"{label}: no answer within {timeout:.0f} s\n{server.logs()}") from None
    except ExceptionGroup as group_error:  # the openai client's: connection lost, 5xx, timeout
        e = group_error.exceptions[0]
        dead = "; a server process has exited" if any(not p.running for p in server.procs) else ""
        raise BenchError(f"{label}: {type(e).__name__}: {e}{dead}\n{server.logs()}") from e
    per_client = [t.result() for t in tasks]
    wall = time.perf_counter() - t0
    requests = [r for results in per_client for r in results]
    return RoundResult(server.name, kind, len(conversations), rep, wall, RETRIES.causes, requests)
