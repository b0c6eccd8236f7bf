"""Anthropic's Messages API on `mlx-cluster serve`: POST /v1/messages and
/v1/messages/count_tokens bodies checked into the same GenerateRequest as an OpenAI chat request
(request_api.py), and errors in Anthropic's shape. The answers' shapes are anthropic_bodies.py.

The conversion: `system` becomes a first system message, text blocks are joined, an assistant's
tool_use blocks become its tool_calls, a user's tool_result blocks become tool messages, and
tools' input_schema becomes parameters. tool_choice auto / any / tool / none map to auto /
required / a named function / none, and output_config.format (structured output) to
response_format.
"""

from __future__ import annotations

from typing import Any

from launcher.serve.request_api import (
    MAX_INT,
    ApiError,
    GenerateRequest,
    ToolChoice,
    bad,
    checked_choice,
    integer,
    number,
    parse_body,
    string_list,
    tool_name,
)
from launcher.serve.strict_schema import strict_flag, strict_schema

MAX_STOP_SEQUENCES = 16  # Anthropic sets no limit; rank 0 scans each at every delta
MAX_TOOLS = 128
REFUSED_BLOCKS = {"image": "images", "document": "documents", "file": "files"}
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


def _text_blocks(content: Any, where: str, allowed: tuple[str, ...] = ("text",)) -> list[Any]:
    """A content list's blocks, every one an object of an allowed type (images and documents
    refused by name)."""
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise bad(f"{where} must be a string or a list of content blocks", where)
    for j, block in enumerate(content):
        kind, at = block.get("type"), f"{where}[{j}]"
        if kind in REFUSED_BLOCKS:
            raise bad(
                f"{at} is an {kind!r} block: mlx-cluster serve takes text only "
                f"(no {REFUSED_BLOCKS[kind]})",
                f"{at}.type",
            )
        if kind not in allowed:
            raise bad(f"{at}.type must be one of {', '.join(allowed)}, not {kind!r}", f"{at}.type")
        if kind == "text" and not isinstance(block.get("text"), str):
            raise bad(f"{at}.text must be a string", f"{at}.text")
    return content


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    return "".join(b["text"] for b in _text_blocks(content, where))


def _tool_use(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = block.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"{at}.id must be a non-empty string", f"{at}.id")
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise bad(f"{at}.input must be an object", f"{at}.input")
    name = tool_name(block.get("name"), f"{at}.name")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"{at}.tool_use_id must name the tool_use this answers", f"{at}.tool_use_id")
    content = block.get("content", "")
    return {"role": "tool", "tool_call_id": call_id, "content": _text(content, f"{at}.content")}


def _user(content: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: each tool_result is a tool message; text between them one user message."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, block in enumerate(content):
        if block["type"] == "tool_result":
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            out.append(_tool_result(block, f"{where}[{j}]"))
        else:
            text.append(block["text"])
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(content: list[dict[str, Any]], where: str) -> dict[str, Any]:
    text = "".join(b["text"] for b in content if b["type"] == "text")
    uses = [(j, b) for j, b in enumerate(content) if b["type"] == "tool_use"]
    calls = [_tool_use(b, f"{where}[{j}]") for j, b in uses]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def _messages(raw: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    messages = raw.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of {role, content}", "messages")
    out: list[dict[str, Any]] = []
    system = raw.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise bad(f"messages[{i}].role must be 'user' or 'assistant'", f"messages[{i}].role")
        content, where = m.get("content"), f"messages[{i}].content"
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        allowed = ("text", "tool_result") if role == "user" else ("text", "tool_use")
        blocks = _text_blocks(content, where, allowed)
        out.extend(_user(blocks, where) if role == "user" else [_assistant(blocks, where)])
    return tuple(out)


def _tools(value: Any) -> tuple[tuple[dict[str, Any], ...] | None, tuple[str, ...]]:
    """Anthropic's client tools as OpenAI function tools (input_schema → parameters), as the
    chat template gets them, and the names of the strict ones."""
    if value is None or value == []:
        return None, ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise bad(f"'tools' must be a list of up to {MAX_TOOLS} tools", "tools")
    tools, names, strict = [], set(), []
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad(f"{at} must be an object", at)
        if tool.get("type") not in (None, "custom"):  # Anthropic's server tools run there
            raise bad(f"{at}.type {tool['type']!r}: only client tools are served", f"{at}.type")
        name = tool_name(tool.get("name"), f"{at}.name")
        if name in names:
            raise bad(f"{at}.name {name!r} is given twice", f"{at}.name")
        names.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad(f"{at}.input_schema must be a JSON schema object", f"{at}.input_schema")
        if strict_flag(tool.get("strict"), f"{at}.strict"):
            schema = strict_schema(schema, f"{at}.input_schema")
            strict.append(name)
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise bad(f"{at}.description must be a string", f"{at}.description")
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tuple(tools), tuple(strict)


def _tool_choice(value: Any) -> tuple[ToolChoice | None, bool | None]:
    """(the normalized choice, parallel_tool_calls)."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, dict) else None
    choices: dict[Any, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}
    if kind == "tool":
        choice: ToolChoice = {"name": tool_name(value.get("name"), "tool_choice.name")}
    elif kind in choices:
        choice = choices[kind]
    else:
        raise bad("'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'", "tool_choice")
    single = value.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise bad("'tool_choice.disable_parallel_tool_use' must be true or false", "tool_choice")
    return choice, None if single is None else not single


def _output_format(value: Any) -> dict[str, Any] | None:
    """Anthropic's structured output (output_config.format) as rank 0's response_format;
    output_config's other keys (effort) change nothing here."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("'output_config' must be an object", "output_config")
    fmt = value.get("format")
    if fmt is None:
        return None
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise bad(
            '\'output_config.format\' must be {"type": "json_schema", "schema": {...}}',
            "output_config.format",
        )
    return {"type": "json_schema", "schema": fmt["schema"]}


def _conversation(raw: dict[str, Any]) -> dict[str, Any]:
    """What the Messages request and its token count share: the prompt and the tools."""
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string", "model")
    messages = _messages(raw)
    tools, strict = _tools(raw.get("tools"))
    choice, parallel = _tool_choice(raw.get("tool_choice"))
    return {
        "messages": messages,
        "tools": tools,
        "tool_choice": checked_choice(choice, tools, "tool_choice"),
        "parallel_tool_calls": parallel if tools else None,
        "strict_tools": strict or None,
    }


def parse_messages(body: bytes) -> GenerateRequest:
    """POST /v1/messages."""
    raw = parse_body(body)
    conversation = _conversation(raw)
    if raw.get("max_tokens") is None:
        raise bad("'max_tokens' is required", "max_tokens")
    stream = raw.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be true or false", "stream")
    top_p = number(raw, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise bad("'top_p' must be more than 0", "top_p")
    return GenerateRequest(
        kind="anthropic",
        max_tokens=int(integer(raw, "max_tokens", 1, 1, MAX_INT) or 1),
        temperature=number(raw, "temperature", 1.0, 0.0, 1.0),
        top_p=top_p,
        seed=None,
        stop=string_list(raw.get("stop_sequences"), "stop_sequences", MAX_STOP_SEQUENCES),
        stream=stream,
        include_usage=True,
        top_k=int(integer(raw, "top_k", 0, 0, MAX_INT) or 0),
        response_format=_output_format(raw.get("output_config")),
        **conversation,
    )


def parse_count_tokens(body: bytes) -> GenerateRequest:
    """POST /v1/messages/count_tokens: rank 0 only reads the prompt (tools included)."""
    raw = parse_body(body)
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
        **_conversation(raw),
    )
