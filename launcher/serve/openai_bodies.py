"""The OpenAI answers of `mlx-cluster serve`, built from rank 0's events: the whole body of a
non-streamed request, or the server-sent chunks of a streamed one (ending in `data: [DONE]`).

Rank 0 sends, per choice (`index`, absent = 0): `begin`, `delta` {text, logprobs?},
`tool_call` {call: {id, name, arguments}} when a call starts and `tool_call` {arguments} as its
arguments grow, and `done` {finish_reason, token counts}; a request with n choices ends after n
`done` events. A call cut by max_tokens keeps its partial arguments and `finish_reason: length`.
Usage counts the shared prompt once and every choice's completion tokens.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from launcher.serve.request_api import GenerateRequest

Event = dict[str, Any]


def sse(body: dict[str, Any], name: str | None = None) -> bytes:
    """One server-sent event (OpenAI's carry no event name; Anthropic's do)."""
    head = b"" if name is None else b"event: " + name.encode() + b"\n"
    return head + b"data: " + json.dumps(body).encode() + b"\n\n"


def progress_comment(event: Event) -> bytes:
    """A long prompt's progress as an SSE comment: proxies and clients see a live stream."""
    return b": prompt %d/%d\n\n" % (int(event.get("read", 0)), int(event.get("total", 0)))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens: prompt tokens rank 0 took from its prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


# What a `done` event tells of drafting: OpenAI's two Predicted Outputs counts, then ours.
PREDICTION_KEYS = ("accepted_prediction_tokens", "rejected_prediction_tokens")
DRAFT_KEYS = ("drafted_tokens", "accepted_tokens", "draft_checks")


def count(event: Event, key: str) -> int:
    value = event.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def completion_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """The legacy completions shape from rank 0's per-token entries: the alternatives as
    {token: logprob}, always with the chosen token (up to logprobs + 1 of them, as OpenAI), and
    each token's offset in the choice's text."""
    out: dict[str, list[Any]] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for entry in entries:
        token = str(entry.get("token", ""))
        top: dict[str, Any] = {}
        # Tokens that decode alike (partial UTF-8: '\ufffd') share a key: the likeliest keeps it.
        for alternative in entry.get("top_logprobs") or []:
            top.setdefault(str(alternative.get("token", "")), alternative.get("logprob"))
        top.setdefault(token, entry.get("logprob"))
        out["tokens"].append(token)
        out["token_logprobs"].append(entry.get("logprob"))
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(token)
    return out


def tool_call_body(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(call.get("id", "")),
        "type": "function",
        "function": {
            "name": str(call.get("name", "")),
            "arguments": str(call.get("arguments", "")),
        },
    }


@dataclass
class Choice:
    """What one choice has produced so far."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0  # the characters of the tokens seen so far (completions' text_offset)
    finish: str | None = None


class OpenAIAnswer:
    """One chat or completion request's answer, fed rank 0's events in order."""

    def __init__(self, generate: GenerateRequest, request_id: str, model: str) -> None:
        self.kind, self.id, self.model = generate.kind, request_id, model
        self.include_usage = generate.include_usage
        self.with_logprobs = generate.logprobs is not None
        self.choices = [Choice() for _ in range(generate.n)]
        self.ended = 0
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.created = int(time.time())
        self.drafts: dict[str, int] | None = None  # summed over choices, once any drafted

    @property
    def finished(self) -> bool:
        return self.ended == len(self.choices)

    def _choice(self, event: Event) -> tuple[int, Choice]:
        index = count(event, "index")
        if not 0 <= index < len(self.choices):
            index = 0  # never expected: better one choice too long than a lost event
        return index, self.choices[index]

    def feed(self, event: Event) -> list[bytes]:
        """Take one event; the SSE chunks it makes (used only when streaming)."""
        name = event.get("event")
        if name == "prompt_progress":
            return [progress_comment(event)]
        index, choice = self._choice(event)
        if name == "delta":
            text, entries = str(event.get("text") or ""), list(event.get("logprobs") or [])
            choice.text += text
            choice.logprobs += entries
            if not text and not entries:
                return []
            chunk = self._delta_chunk(index, choice, text, entries)
            choice.offset += sum(len(str(e.get("token", ""))) for e in entries)
            return [sse(chunk)]
        if name == "tool_call" and self.kind == "chat":
            part = self._tool_call(choice, event)
            if part is None:
                return []
            delta = {"tool_calls": [part]}
            return [sse(self._chunk([{"index": index, "delta": delta, **self._none()}]))]
        if name == "done" and choice.finish is None:
            return [sse(self._done(index, choice, event))]
        return []

    def _tool_call(self, choice: Choice, event: Event) -> dict[str, Any] | None:
        """A call's first delta (index, id, type, name, the arguments so far), or the text its
        arguments grew by, as OpenAI streams them; the call is kept for the whole answer."""
        if event.get("call") is not None:
            call = tool_call_body(event["call"])
            choice.tool_calls.append(call)
            return {"index": len(choice.tool_calls) - 1, **call}
        more = str(event.get("arguments") or "")
        if not choice.tool_calls or not more:
            return None  # never expected: arguments before their call's start
        choice.tool_calls[-1]["function"]["arguments"] += more
        return {"index": len(choice.tool_calls) - 1, "function": {"arguments": more}}

    def _none(self) -> dict[str, Any]:
        return {"logprobs": None, "finish_reason": None}

    def _delta_chunk(
        self, index: int, choice: Choice, text: str, entries: list[dict[str, Any]]
    ) -> dict[str, Any]:
        if self.kind == "chat":
            logprobs = {"content": entries, "refusal": None} if self.with_logprobs else None
            part = {"index": index, "delta": {"content": text}, "logprobs": logprobs}
        else:
            shaped = completion_logprobs(entries, choice.offset) if self.with_logprobs else None
            part = {"index": index, "text": text, "logprobs": shaped}
        return self._chunk([{**part, "finish_reason": None}])

    def _done(self, index: int, choice: Choice, event: Event) -> dict[str, Any]:
        finish = str(event.get("finish_reason") or "stop")
        choice.finish = "tool_calls" if choice.tool_calls and finish == "stop" else finish
        self.ended += 1
        self.completion_tokens += count(event, "completion_tokens")
        if "drafted_tokens" in event:
            drafts = self.drafts or dict.fromkeys(PREDICTION_KEYS + DRAFT_KEYS, 0)
            self.drafts = {k: v + count(event, k) for k, v in drafts.items()}
        if index == 0 or not self.prompt_tokens:  # the prompt is shared: counted once
            self.prompt_tokens = count(event, "prompt_tokens")
            self.cached_tokens = count(event, "cached_tokens")
        if self.kind == "chat":
            part: dict[str, Any] = {"index": index, "delta": {}, "logprobs": None}
        else:
            part = {"index": index, "text": "", "logprobs": None}
        return self._chunk([{**part, "finish_reason": choice.finish}])

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage; a request that drafted also gets OpenAI's prediction counts and our
        own speculation counts (drafted, accepted, forwards that checked drafts)."""
        body = usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
        if self.drafts is not None:
            body["completion_tokens_details"] = {k: self.drafts[k] for k in PREDICTION_KEYS}
            body["speculative"] = {k: self.drafts[k] for k in DRAFT_KEYS}
        return body

    def opening(self) -> list[bytes]:
        """A chat stream names the role first, once per choice."""
        if self.kind != "chat":
            return []
        first = [{"index": i, "delta": {"role": "assistant", "content": ""}, **self._none()}
                 for i in range(len(self.choices))]  # fmt: skip
        return [sse(self._chunk(first))]

    def closing(self) -> list[bytes]:
        """After every choice's end: the usage chunk (no choices) when asked, then [DONE]."""
        frames = []
        if self.include_usage:
            frames.append(sse({**self._chunk([]), "usage": self.usage()}))
        return [*frames, b"data: [DONE]\n\n"]

    def failure(self, error: dict[str, Any]) -> list[bytes]:
        """A stream that cannot finish ends with OpenAI's error object."""
        return [sse(error)]

    def body(self) -> dict[str, Any]:
        """The whole answer of a non-streamed request."""
        choices = []
        for i, c in enumerate(self.choices):
            if self.kind == "chat":
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": None if c.tool_calls and not c.text else c.text,
                }
                if c.tool_calls:
                    message["tool_calls"] = c.tool_calls
                logprobs = {"content": c.logprobs, "refusal": None} if self.with_logprobs else None
                choices.append({"index": i, "message": message, "logprobs": logprobs})
            else:
                shaped = completion_logprobs(c.logprobs, 0) if self.with_logprobs else None
                choices.append({"index": i, "text": c.text, "logprobs": shaped})
            choices[-1]["finish_reason"] = c.finish or "stop"
        return {
            "id": self.id,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }


def models_body(model: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "mlx-cluster"}],
    }
