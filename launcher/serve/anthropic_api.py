"""Anthropic's Messages API on `mlx-cluster serve`: POST /v1/messages and
/v1/messages/count_tokens bodies, checked against their declared models (anthropic_models.py),
turned into the same GenerateRequest as an OpenAI chat request (request_api.py), and errors in
Anthropic's shape. The answers' shapes are anthropic_bodies.py.

The conversion: `system` becomes a first system message, text blocks are joined, an assistant's
tool_use blocks become its tool_calls, a user's tool_result blocks become tool messages, and
tools' input_schema becomes parameters. tool_choice auto / any / tool / none map to auto /
required / a named function / none, and output_config.format (structured output) to
response_format.
"""

from __future__ import annotations

from typing import Any

from launcher.serve.anthropic_models import (
    PARAMS,
    AssistantOther,
    ClientTool,
    CountTokensBody,
    MessagesBody,
    NamedToolChoice,
    TextBlock,
    ToolChoiceValue,
    ToolResultBlock,
    ToolUseBlock,
    UserOther,
    UserTurn,
)
from launcher.serve.request_api import ApiError, GenerateRequest, ToolChoice, checked_choice
from launcher.serve.request_errors import validated
from launcher.serve.strict_schema import strict_schema

MODES: dict[str, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}
# Anthropic's error types by HTTP status (its SDK raises the matching exception from the status).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def error_body(e: ApiError) -> dict[str, Any]:
    """Anthropic's error object for an ApiError."""
    kind = ERROR_TYPES.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def parse_messages(body: bytes) -> GenerateRequest:
    """POST /v1/messages."""
    request = validated(MessagesBody, body, PARAMS)
    fmt = request.output_config.format if request.output_config else None
    return GenerateRequest(
        kind="anthropic",
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=None,
        stop=tuple(request.stop_sequences),
        stream=request.stream,
        include_usage=True,
        top_k=request.top_k,
        response_format=None if fmt is None else {"type": "json_schema", "schema": fmt.schema_},
        **_conversation(request),
    )


def parse_count_tokens(body: bytes) -> GenerateRequest:
    """POST /v1/messages/count_tokens: rank 0 only reads the prompt (tools included)."""
    request = validated(CountTokensBody, body, PARAMS)
    return GenerateRequest(
        kind="anthropic",
        max_tokens=1,
        temperature=0.0,
        top_p=1.0,
        seed=None,
        stop=(),
        stream=False,
        include_usage=False,
        count_only=True,
        **_conversation(request),
    )


def _conversation(request: CountTokensBody) -> dict[str, Any]:
    """What the Messages request and its token count share: the prompt and the tools."""
    tools, strict = _tools(request.tools)
    choice, parallel = _tool_choice(request.tool_choice)
    return {
        "messages": _messages(request),
        "tools": tools,
        "tool_choice": checked_choice(choice, tools, "tool_choice"),
        "parallel_tool_calls": parallel if tools else None,
        "strict_tools": strict or None,
    }


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


def _messages(request: CountTokensBody) -> tuple[dict[str, Any], ...]:
    out: list[dict[str, Any]] = []
    if request.system is not None:
        out.append({"role": "system", "content": _text(request.system)})
    for m in request.messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif isinstance(m, UserTurn):
            out += _user(m.content)
        else:
            out.append(_assistant(m.content))
    return tuple(out)


def _user(content: list[TextBlock | ToolResultBlock | UserOther]) -> list[dict[str, Any]]:
    """A user turn: each tool_result is a tool message; text between them one user message."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for block in content:
        if isinstance(block, ToolResultBlock):
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            tool = {"role": "tool", "tool_call_id": block.tool_use_id}
            out.append({**tool, "content": _text(block.content)})
        elif isinstance(block, TextBlock):
            text.append(block.text)
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(content: list[TextBlock | ToolUseBlock | AssistantOther]) -> dict[str, Any]:
    text = "".join(b.text for b in content if isinstance(b, TextBlock))
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
        for b in content
        if isinstance(b, ToolUseBlock)
    ]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def _tools(value: list[ClientTool]) -> tuple[tuple[dict[str, Any], ...] | None, tuple[str, ...]]:
    """Anthropic's client tools as OpenAI function tools (input_schema → parameters), as the
    chat template gets them, and the names of the strict ones."""
    if not value:
        return None, ()
    tools, strict = [], []
    for i, tool in enumerate(value):
        schema = tool.input_schema
        if tool.strict:
            schema = strict_schema(schema, f"tools[{i}].input_schema")
            strict.append(tool.name)
        function: dict[str, Any] = {"name": tool.name, "parameters": schema}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    return tuple(tools), tuple(strict)


def _tool_choice(value: ToolChoiceValue | None) -> tuple[ToolChoice | None, bool | None]:
    """(the normalized choice, parallel_tool_calls)."""
    if value is None:
        return None, None
    choice = {"name": value.name} if isinstance(value, NamedToolChoice) else MODES[value.type]
    single = value.disable_parallel_tool_use
    return choice, None if single is None else not single
