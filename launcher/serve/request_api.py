"""What every API of `mlx-cluster serve` turns a request into: one checked GenerateRequest (the line
rank 0 reads), or an ApiError naming the bad field.

Shared by the OpenAI routes (openai_api.py) and the Anthropic ones (anthropic_api.py): the bodies
are declared as pydantic models (openai_models.py, anthropic_models.py) and checked by
request_errors.py; what is here is the logic that is not a body's shape. Nothing here talks to
ranks or sockets.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

ToolChoice = str | dict[str, str]  # "auto" | "none" | "required" | {"name": function}
ID_PREFIXES = {"chat": "chatcmpl-", "completion": "cmpl-", "anthropic": "msg_"}
MAX_SEED = 2**63 - 1  # OpenAI's seed is an int64 (rank 0 checks the same bound)
MAX_INT = 2**31 - 1  # token counts and top_k: beyond any model


class ApiError(Exception):
    """An error answer: HTTP status plus OpenAI's error object (anthropic_api.py renders the
    same error in Anthropic's shape on its routes)."""

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


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True)
class GenerateRequest:
    """One checked request, as rank 0 needs it (plus how to answer). Unused options keep their
    neutral value and stay out of the rank line."""

    kind: str  # "chat" | "completion" | "anthropic" (a chat request answered in Anthropic's shapes)
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    messages: tuple[dict[str, Any], ...] | None = None
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    strict_tools: tuple[str, ...] | None = None  # tools with strict: true (auto mode constrains)
    response_format: dict[str, Any] | None = None
    logprobs: int | None = None  # top alternatives per token (0: only the chosen token's)
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int = 1
    count_only: bool = False
    max_tokens_default: bool = False  # not asked for: may shrink to fit the context
    prediction: str | None = None  # OpenAI's Predicted Outputs: text the answer likely repeats

    def rank_line(self, request_id: str, seed: int) -> str:
        """The JSON line for rank 0's stdin (cluster/serve/requests.py reads it)."""
        raw: dict[str, Any] = {
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
        extra: dict[str, Any] = {
            "tools": None if self.tools is None else list(self.tools),
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "strict_tools": None if self.strict_tools is None else list(self.strict_tools),
            "response_format": self.response_format,
            "logprobs": self.logprobs,
            "top_k": self.top_k or None,
            "min_p": self.min_p or None,
            "presence_penalty": self.presence_penalty or None,
            "frequency_penalty": self.frequency_penalty or None,
            "repetition_penalty": self.repetition_penalty,
            "logit_bias": self.logit_bias or None,
            "n": self.n if self.n > 1 else None,
            "count_only": self.count_only or None,
            "max_tokens_default": self.max_tokens_default or None,
            "prediction": self.prediction or None,
        }
        raw.update((k, v) for k, v in extra.items() if v is not None)
        return json.dumps(raw, separators=(",", ":")) + "\n"


def new_id(kind: str) -> str:
    """The request's id: rank 0 tags its events with it, and the answer carries it."""
    return ID_PREFIXES.get(kind, "cmpl-") + uuid.uuid4().hex[:24]


def arguments_value(arguments: str) -> Any:
    """A tool call's JSON arguments as the chat template expects them: the object when the text
    parses as one (templates render it with tojson), else the text itself."""
    try:
        parsed = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def checked_choice(
    choice: ToolChoice | None, tools: tuple[dict[str, Any], ...] | None, param: str
) -> ToolChoice | None:
    """A normalized tool choice against the tools given: none at all without tools (nothing to
    choose from), 'auto' by default with them; 'required' or a name needs tools, and the name
    must be one of them."""
    if not tools:
        if choice in (None, "auto", "none"):
            return None
        raise bad(f"'{param}' needs 'tools' to choose from", param)
    if isinstance(choice, dict):
        names = [t["function"]["name"] for t in tools]
        if choice["name"] not in names:
            raise bad(f"'{param}' names {choice['name']!r}, which is not among the tools", param)
    return "auto" if choice is None else choice
