"""The OpenAI-compatible surface of `mlx-cluster serve`: request checks and response bodies.

Pure functions of the request JSON: nothing here talks to ranks or sockets. A bad body raises
ApiError, which the HTTP layer turns into OpenAI's error object
{"error": {"message", "type", "param", "code"}} with the matching status.
Sampling defaults follow OpenAI's: temperature 1, top_p 1, max_tokens 16 for completions.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

CHAT_MAX_TOKENS = 512  # OpenAI has no fixed chat default; mlx-lm's server uses 512
COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
MAX_STOP_STRINGS = 4  # as OpenAI
ROLES = ("system", "developer", "user", "assistant", "tool")
# Accepted only at their neutral value: anything else would change the answer unannounced.
NEUTRAL = {
    "n": 1,
    "best_of": 1,
    "echo": False,
    "logprobs": None,
    "top_logprobs": None,
    "suffix": None,
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
}


class ApiError(Exception):
    """An error answer: HTTP status plus OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type, self.param, self.code = type_, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True)
class GenerateRequest:
    """One checked request, as rank 0 needs it (plus how to answer)."""

    kind: str  # "chat" | "completion"
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None

    def rank_line(self, request_id: str, seed: int) -> str:
        """The JSON line for rank 0's stdin (cluster/serve/requests.py reads it)."""
        raw = {
            "id": request_id,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": seed if self.seed is None else self.seed,
            "stop": list(self.stop),
            "messages": None if self.messages is None else list(self.messages),
            "prompt": self.prompt,
            "prompt_ids": None if self.prompt_ids is None else list(self.prompt_ids),
        }
        return json.dumps(raw, separators=(",", ":")) + "\n"


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        raw = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(f"the request body is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise _bad("the request body must be a JSON object")
    return raw


def _number(raw: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(f"'{name}' must be a number from {low:g} to {high:g}", name)
    return float(value)


def _int(raw: dict[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(f"'{name}' must be an integer of at least {low}", name)
    return value


def _stop(raw: dict[str, Any]) -> tuple[str, ...]:
    value = raw.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) and s for s in stops)
        or len(stops) > MAX_STOP_STRINGS
    ):
        raise _bad(
            f"'stop' must be a non-empty string or a list of up to {MAX_STOP_STRINGS}", "stop"
        )
    return tuple(stops)


def _common(raw: dict[str, Any], kind: str, max_tokens: int | None) -> dict[str, Any]:
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("'model' must be a string", "model")
    for name, neutral in NEUTRAL.items():
        if raw.get(name) not in (None, neutral):
            raise _bad(f"'{name}' is not supported by mlx-cluster serve (leave it out)", name)
    stream = raw.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false", "stream")
    options = raw.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise _bad(
            "'stream_options' must be an object, and only with 'stream': true", "stream_options"
        )
    include_usage = bool((options or {}).get("include_usage", False))
    default = CHAT_MAX_TOKENS if kind == "chat" else COMPLETION_MAX_TOKENS
    top_p = _number(raw, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise _bad("'top_p' must be more than 0", "top_p")
    return {
        "kind": kind,
        "max_tokens": max_tokens or _int(raw, "max_tokens", default, 1),
        "temperature": _number(raw, "temperature", 1.0, 0.0, 2.0),
        "top_p": top_p,
        "seed": _int(raw, "seed", None, 0),
        "stop": _stop(raw),
        "stream": stream,
        "include_usage": include_usage,
    }


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else None
    if parts is None or not all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
    texts = [p.get("text") for p in parts]
    if not all(isinstance(t, str) for t in texts):
        raise _bad(f"messages[{i}].content text parts need a string 'text'", "messages")
    return "".join(str(t) for t in texts)


def parse_chat(body: bytes) -> GenerateRequest:
    """POST /v1/chat/completions."""
    raw = parse_body(body)
    messages = raw.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list of {role, content}", "messages")
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}] needs a 'role' among {', '.join(ROLES)}", "messages")
        checked.append({"role": str(m["role"]), "content": _content(m, i)})
    max_tokens = _int(raw, "max_completion_tokens", None, 1)
    return GenerateRequest(**_common(raw, "chat", max_tokens), messages=tuple(checked))


def parse_completion(body: bytes) -> GenerateRequest:
    """POST /v1/completions: one prompt, as a string or token ids."""
    raw = parse_body(body)
    prompt = raw.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    common = _common(raw, "completion", None)
    if isinstance(prompt, str) and prompt:
        return GenerateRequest(**common, prompt=prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return GenerateRequest(**common, prompt_ids=tuple(prompt))
    raise _bad("'prompt' must be one non-empty string or one list of token ids", "prompt")


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens: prompt tokens rank 0 took from its prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def done_usage(event: dict[str, Any]) -> dict[str, Any]:
    """The usage object from rank 0's `done` event (cached_tokens is absent from older ranks)."""
    return usage(
        int(event["prompt_tokens"]),
        int(event["completion_tokens"]),
        int(event.get("cached_tokens") or 0),
    )


def response_body(
    kind: str, request_id: str, model: str, text: str, finish: str, counts: dict[str, Any]
) -> dict[str, Any]:
    """The whole answer of a non-streaming request."""
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {
        "id": request_id,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": counts,
    }


def chunk_body(
    kind: str,
    request_id: str,
    model: str,
    text: str | None,
    finish: str | None = None,
    counts: dict[str, Any] | None = None,
    first: bool = False,
) -> dict[str, Any]:
    """One streamed chunk: text (None: the final chunk with the finish reason; with counts:
    the usage chunk, which has no choices). A chat stream's first chunk names the role."""
    choices: list[dict[str, Any]] = []
    if counts is None:
        if kind == "chat":
            delta: dict[str, str] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", **delta}
            choices = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        else:
            choices = [{"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}]
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if counts is not None:
        body["usage"] = counts
    return body


def models_body(model: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "mlx-cluster"}],
    }
