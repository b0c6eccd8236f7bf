"""The good requests of the mixed load, one function a kind, through the official `openai` and
`anthropic` clients. Each returns its streaming gaps ([(when, gap)], seconds on the soak's clock)
and its text, and raises on an error or an answer that breaks the API's promise."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Gaps = list[tuple[float, float]]
STREAM_TOKENS = 32
PLAIN_TOKENS = 24
SEEDED = [(f"Seeded prompt {k}: tell a short story about the sea.", 1000 + k) for k in range(4)]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
SUM = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": SUM}},
]
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 20},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}


class BrokenPromise(Exception):
    """The request succeeded but its answer is not what the API promises."""


@dataclass
class Ctx:
    openai: Any  # openai.AsyncOpenAI
    anthropic: Any  # anthropic.AsyncAnthropic
    model: str
    prefix: str  # the long system prompt every kind but the seeded one shares
    t0: float
    stop_at: float = 0.0  # on the soak's clock: no request starts after it

    def now(self) -> float:
        return time.monotonic() - self.t0


@dataclass
class Outcome:
    gaps: Gaps
    text: str = ""


def _messages(ctx: Ctx, rng: random.Random) -> list[dict[str, str]]:
    question = f"Question {rng.randrange(10**6)}: what is the best way to cross the river?"
    return [{"role": "system", "content": ctx.prefix}, {"role": "user", "content": question}]


class _Gaps:
    """Gaps between consecutive content chunks of one stream."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.gaps: Gaps = []
        self.last: float | None = None
        self.chunks = 0

    def tick(self) -> None:
        now = self.ctx.now()
        if self.last is not None:
            self.gaps.append((now, now - self.last))
        self.last, self.chunks = now, self.chunks + 1


async def stream_chat(ctx: Ctx, rng: random.Random) -> Outcome:
    seeded = rng.random() < 0.5
    extra: dict[str, Any] = {"seed": rng.randrange(2**31), "temperature": 0.8} if seeded else {}
    stream = await ctx.openai.chat.completions.create(
        model=ctx.model, messages=_messages(ctx, rng), max_tokens=STREAM_TOKENS, stream=True,
        stream_options={"include_usage": True}, **({"temperature": 0.0} | extra),
    )  # fmt: skip
    gaps, text = _Gaps(ctx), []
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                gaps.tick()
                text.append(choice.delta.content)
    return Outcome(gaps.gaps, "".join(text))


async def chat_n(ctx: Ctx, rng: random.Random) -> Outcome:
    n = rng.choice((2, 3))
    out = await ctx.openai.chat.completions.create(
        model=ctx.model, messages=_messages(ctx, rng), max_tokens=PLAIN_TOKENS, n=n,
        seed=rng.randrange(2**31), temperature=0.9,
    )  # fmt: skip
    if len(out.choices) != n:
        raise BrokenPromise(f"asked n={n}, got {len(out.choices)} choices")
    return Outcome([])


async def cancel_stream(ctx: Ctx, rng: random.Random) -> Outcome:
    """Close the stream after a few chunks: the server must withdraw the request and go on."""
    stream = await ctx.openai.chat.completions.create(
        model=ctx.model, messages=_messages(ctx, rng), max_tokens=200, stream=True,
        temperature=0.8,
    )  # fmt: skip
    gaps, after = _Gaps(ctx), rng.randint(1, 4)
    try:
        async for chunk in stream:
            if any(c.delta is not None and c.delta.content for c in chunk.choices):
                gaps.tick()
                if gaps.chunks >= after:
                    break
    finally:
        await stream.close()
    return Outcome(gaps.gaps)


async def tools_required(ctx: Ctx, rng: random.Random) -> Outcome:
    out = await ctx.openai.chat.completions.create(
        model=ctx.model, messages=_messages(ctx, rng), tools=TOOLS, tool_choice="required",
        max_tokens=48, temperature=0.0,
    )  # fmt: skip
    choice = out.choices[0]
    if choice.finish_reason == "tool_calls":
        names = {c.function.name for c in choice.message.tool_calls or []}
        if not names or not names <= {"get_weather", "add"}:
            raise BrokenPromise(f"tool_choice required gave calls {names}")
    elif choice.finish_reason != "length":
        raise BrokenPromise(f"tool_choice required ended with {choice.finish_reason}")
    return Outcome([])


async def tools_auto_stream(ctx: Ctx, rng: random.Random) -> Outcome:
    stream = await ctx.openai.chat.completions.create(
        model=ctx.model, messages=_messages(ctx, rng), tools=TOOLS, tool_choice="auto",
        max_tokens=STREAM_TOKENS, stream=True, temperature=0.0,
    )  # fmt: skip
    gaps = _Gaps(ctx)
    async for chunk in stream:
        for c in chunk.choices:
            if c.delta is not None and (c.delta.content or c.delta.tool_calls):
                gaps.tick()
    return Outcome(gaps.gaps)


async def json_schema(ctx: Ctx, rng: random.Random) -> Outcome:
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER, "strict": True}}
    out = await ctx.openai.chat.completions.create(
        model=ctx.model, messages=_messages(ctx, rng), response_format=fmt, max_tokens=64,
        seed=rng.randrange(2**31), temperature=0.7,
    )  # fmt: skip
    choice = out.choices[0]
    if choice.finish_reason == "stop":
        try:
            value = json.loads(choice.message.content or "")
        except ValueError as e:
            raise BrokenPromise(f"json_schema answer is not JSON: {e}") from None
        if not isinstance(value, dict) or set(value) != {"answer", "score"}:
            raise BrokenPromise(f"json_schema answer breaks the schema: {value!r}")
    return Outcome([], choice.message.content or "")


async def seeded_completion(ctx: Ctx, rng: random.Random) -> Outcome:
    """One of a few fixed (prompt, seed) pairs at temperature 1: the same text every time."""
    prompt, seed = rng.choice(SEEDED)
    out = await ctx.openai.completions.create(
        model=ctx.model, prompt=prompt, max_tokens=16, temperature=1.0, seed=seed
    )
    return Outcome([], f"{seed}\n{out.choices[0].text}")


async def anthropic_message(ctx: Ctx, rng: random.Random) -> Outcome:
    question = f"Question {rng.randrange(10**6)}: name three harbours."
    kwargs: dict[str, Any] = {
        "model": ctx.model, "max_tokens": STREAM_TOKENS, "system": ctx.prefix,
        "messages": [{"role": "user", "content": question}],
        # This client version has no `temperature` argument; the server takes it from the body.
        "extra_body": {"temperature": 0.5},
    }  # fmt: skip
    if rng.random() < 0.5:
        if rng.random() < 0.5:  # a forced tool call: Anthropic's `any`
            kwargs["tools"] = [{"name": "add", "description": "Adds", "input_schema": SUM}]
            kwargs["tool_choice"] = {"type": "any"}
        out = await ctx.anthropic.messages.create(**kwargs)
        if "tools" in kwargs and out.stop_reason not in ("tool_use", "max_tokens"):
            raise BrokenPromise(f"tool_choice any ended with {out.stop_reason}")
        return Outcome([])
    stream = await ctx.anthropic.messages.create(stream=True, **kwargs)
    gaps, stop = _Gaps(ctx), None
    async for event in stream:
        if event.type == "content_block_delta":
            gaps.tick()
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    if stop is None:
        raise BrokenPromise("Anthropic stream ended without a stop_reason")
    return Outcome(gaps.gaps)


Kind = Callable[[Ctx, random.Random], Awaitable[Outcome]]
# Weights: mostly streams (the ITL figures come from them), every other feature often enough
# to be exercised every minute by 16 clients.
KINDS: dict[str, tuple[Kind, int]] = {
    "stream_chat": (stream_chat, 5),
    "chat_n": (chat_n, 2),
    "cancel": (cancel_stream, 2),
    "tools_required": (tools_required, 1),
    "tools_auto_stream": (tools_auto_stream, 1),
    "json_schema": (json_schema, 1),
    "seeded_completion": (seeded_completion, 1),
    "anthropic": (anthropic_message, 2),
}
