"""One streamed request through the official openai client, timed on the client's side, and
one round of requests sent at once."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from .servers import Running
from .workloads import Request


@dataclass
class Result:
    server: str
    kind: str
    ttft: float
    seconds: float
    tokens: int
    text: str
    gaps: list[float] = field(default_factory=list)  # between streamed text chunks
    drafted: int = 0
    accepted: int = 0
    checks: int = 0


async def one(client: Any, server: Running, request: Request) -> Result:
    start = time.perf_counter()
    stream = await client.chat.completions.create(
        model=server.model,
        messages=request.messages,
        max_tokens=request.max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=request.extra or None,
    )
    first = last = None
    gaps: list[float] = []
    text: list[str] = []
    usage: Any = None
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                text.append(choice.delta.content)
                first = now if first is None else first
                if last is not None:
                    gaps.append(now - last)
                last = now
    end = time.perf_counter()
    spec = (usage.model_extra or {}).get("speculative") or {} if usage is not None else {}
    return Result(
        server.spec.label,
        request.kind,
        (first or end) - start,
        end - start,
        usage.completion_tokens if usage is not None else 0,
        "".join(text),
        gaps,
        int(spec.get("drafted_tokens", 0)),
        int(spec.get("accepted_tokens", 0)),
        int(spec.get("draft_checks", 0)),
    )


async def round_(
    server: Running, requests: list[Request], timeout: float
) -> tuple[float, list[Result]]:
    """The requests at once (one client each); the round's wall time and each result."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=server.base_url, api_key="x", timeout=timeout, max_retries=0
    )
    start = time.perf_counter()
    async with asyncio.timeout(timeout):
        results = await asyncio.gather(*(one(client, server, r) for r in requests))
    await client.close()
    return time.perf_counter() - start, list(results)
