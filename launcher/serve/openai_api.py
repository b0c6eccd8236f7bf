"""The OpenAI requests of `mlx-cluster serve`: /v1/chat/completions and /v1/completions bodies
checked into GenerateRequest (request_api.py); the answers' shapes are openai_bodies.py.

Pure functions of the request JSON: a bad body raises ApiError naming the field, which the HTTP
layer turns into OpenAI's error object {"error": {"message", "type", "param", "code"}}.
Sampling defaults follow OpenAI's: temperature 1, top_p 1, max_tokens 16 for completions.
"""

from __future__ import annotations

import json
import math
from typing import Any

from launcher.serve.request_api import (
    MAX_INT,
    MAX_SEED,
    ApiError,
    GenerateRequest,
    ToolChoice,
    arguments_value,
    bad,
    checked_choice,
    integer,
    new_id,
    number,
    parse_body,
    string_list,
    tool_name,
)
from launcher.serve.strict_schema import strict_flag, strict_schema

__all__ = ["ApiError", "GenerateRequest", "new_id", "parse_chat", "parse_completion"]

CHAT_MAX_TOKENS = 512  # OpenAI has no fixed chat default; mlx-lm's server uses 512
COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
MAX_STOP_STRINGS = 4  # as OpenAI
MAX_CHOICES = 8  # n: each choice is one more sequence in the batch
MAX_TOP_LOGPROBS = {"chat": 20, "completion": 5}  # as OpenAI
MAX_TOOLS = 128  # as OpenAI
ROLES = ("system", "developer", "user", "assistant", "tool")
# Accepted only at their neutral value: anything else would change the answer unannounced.
NEUTRAL: dict[str, Any] = {
    "best_of": 1,
    "echo": False,
    "suffix": None,
    "functions": None,
    "function_call": None,
    "audio": None,
}
# Chat-only options: /v1/completions refuses them unless neutral (as it always has).
COMPLETION_NEUTRAL: dict[str, Any] = {
    "n": 1,
    "top_logprobs": None,
    "tools": None,
    "tool_choice": None,
}
# Content parts other than text, and what they are, for the 400 that refuses them.
REFUSED_PARTS = {
    "image_url": "images",
    "image": "images",
    "input_image": "images",
    "input_audio": "audio",
    "audio": "audio",
    "file": "files",
    "input_file": "files",
}


def _refuse_non_neutral(raw: dict[str, Any], neutral: dict[str, Any]) -> None:
    for name, value in neutral.items():
        if raw.get(name) not in (None, value):
            raise bad(f"'{name}' is not supported by mlx-cluster serve (leave it out)", name)


def _penalty(raw: dict[str, Any], name: str) -> float:
    return number(raw, name, 0.0, -2.0, 2.0)


def _repetition_penalty(raw: dict[str, Any]) -> float | None:
    value = raw.get("repetition_penalty")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise bad("'repetition_penalty' must be a number above 0", "repetition_penalty")
    return None if value == 1 else float(value)  # 1 changes nothing


def _logit_bias(raw: dict[str, Any]) -> dict[str, float] | None:
    value = raw.get("logit_bias")
    if value is None:
        return None
    message = "'logit_bias' must map token ids (as strings) to numbers from -100 to 100"
    if not isinstance(value, dict):
        raise bad(message, "logit_bias")
    bias: dict[str, float] = {}
    for key, b in value.items():
        if (
            not key.isdigit()
            or isinstance(b, bool)
            or not isinstance(b, int | float)
            or not -100 <= b <= 100
        ):
            raise bad(f"{message} (not {key!r}: {json.dumps(b)})", "logit_bias")
        bias[str(int(key))] = float(b)
    return bias or None


def _max_tokens(raw: dict[str, Any], default: int) -> int:
    """max_completion_tokens is the newer name of max_tokens: it wins when both are given."""
    old = integer(raw, "max_tokens", default, 1, MAX_INT)
    new = integer(raw, "max_completion_tokens", None, 1, MAX_INT)
    return new or old or default


def _common(raw: dict[str, Any], kind: str) -> dict[str, Any]:
    """The options both routes share."""
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string", "model")
    _refuse_non_neutral(raw, NEUTRAL)
    stream = raw.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be true or false", "stream")
    options = raw.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise bad(
            "'stream_options' must be an object, and only with 'stream': true", "stream_options"
        )
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad("'stream_options.include_usage' must be true or false", "stream_options")
    top_p = number(raw, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise bad("'top_p' must be more than 0", "top_p")
    default = CHAT_MAX_TOKENS if kind == "chat" else COMPLETION_MAX_TOKENS
    return {
        "kind": kind,
        "max_tokens": _max_tokens(raw, default),
        # Not asked for: rank 0 shrinks it to the context the prompt leaves (else refuses).
        "max_tokens_default": raw.get("max_tokens") is None
        and raw.get("max_completion_tokens") is None,
        "temperature": number(raw, "temperature", 1.0, 0.0, 2.0),
        "top_p": top_p,
        "seed": integer(raw, "seed", None, 0, MAX_SEED),
        "stop": string_list(raw.get("stop"), "stop", MAX_STOP_STRINGS),
        "stream": stream,
        "include_usage": include_usage,
        "top_k": integer(raw, "top_k", 0, 0, MAX_INT),
        "min_p": number(raw, "min_p", 0.0, 0.0, 1.0),
        "presence_penalty": _penalty(raw, "presence_penalty"),
        "frequency_penalty": _penalty(raw, "frequency_penalty"),
        "repetition_penalty": _repetition_penalty(raw),
        "logit_bias": _logit_bias(raw),
        "response_format": response_format(raw.get("response_format")),
        "prediction": _prediction(raw.get("prediction")),
    }


def _prediction(value: Any) -> str | None:
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or text parts}. The text
    only drafts tokens; what is generated does not change."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "content" or "content" not in value:
        raise bad(
            '\'prediction\' must be {"type": "content", "content": text or text parts}',
            "prediction",
        )
    return _text(value["content"], "prediction.content", "prediction") or None


def response_format(value: Any) -> dict[str, Any] | None:
    """OpenAI's response_format, normalized for rank 0: the JSON schema itself under "schema"."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise bad(
            "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
            "response_format",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise bad(
            "'response_format.json_schema' must be an object with the schema under 'schema'",
            "response_format.json_schema.schema",
        )
    for key, types in (("name", str), ("strict", bool), ("description", str)):
        if spec.get(key) is not None and not isinstance(spec[key], types):
            raise bad(
                f"'response_format.json_schema.{key}' has the wrong type",
                f"response_format.json_schema.{key}",
            )
    schema = spec["schema"]
    if spec.get("strict"):
        schema = strict_schema(schema, "response_format.json_schema.schema")
    return {"type": "json_schema", "schema": schema}


def _text(content: Any, where: str, param: str = "messages") -> str:
    """A message's content: a string, or text parts joined (other parts refused by name)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise bad(f"{where} must be a string or a list of text parts", param)
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in REFUSED_PARTS:
            raise bad(
                f"{where}[{j}] is an {kind!r} part: mlx-cluster serve takes text only "
                f"(no {REFUSED_PARTS[kind]})",
                f"{where}[{j}].type",
            )
        if kind != "text":
            raise bad(f"{where}[{j}].type must be 'text', not {kind!r}", f"{where}[{j}].type")
        if not isinstance(part.get("text"), str):
            raise bad(f"{where}[{j}] text parts need a string 'text'", param)
    return "".join(str(p["text"]) for p in content)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant's earlier tool calls, as chat templates take them (arguments parsed)."""
    if not isinstance(calls, list) or not calls:
        raise bad(f"{where} must be a non-empty list of tool calls", where)
    out = []
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise bad(f"{at} must be {{id, type: 'function', function: {{name, arguments}}}}", at)
        name = tool_name(function.get("name"), f"{at}.function.name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise bad(f"{at}.function.arguments must be a string of JSON", f"{at}.function")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise bad(f"{at}.id must be a non-empty string", f"{at}.id")
        out.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments_value(arguments)},
            }
        )
    return out


def _message(m: Any, i: int) -> dict[str, Any]:
    """One chat message in the Hugging Face form chat templates expect."""
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise bad(f"messages[{i}] needs a 'role' among {', '.join(ROLES)}", "messages")
    role, content, where = str(m["role"]), m.get("content"), f"messages[{i}].content"
    if m.get("audio") is not None:
        raise bad(f"messages[{i}].audio: mlx-cluster serve takes text only", f"messages[{i}].audio")
    if role == "assistant":
        text = None if content is None else _text(content, where)
        if m.get("tool_calls") is None:
            return {"role": role, "content": text or ""}
        calls = _tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        return {"role": role, "content": text, "tool_calls": calls}
    if content is None:
        raise bad(f"{where} must be a string or a list of text parts", "messages")
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            at = f"messages[{i}].tool_call_id"
            raise bad(f"{at} must name the tool call this answers", at)
        return {"role": role, "tool_call_id": call_id, "content": _text(content, where)}
    # Templates know "system"; "developer" is OpenAI's newer name for it.
    return {"role": "system" if role == "developer" else role, "content": _text(content, where)}


def _tools(value: Any) -> tuple[tuple[dict[str, Any], ...] | None, tuple[str, ...]]:
    """The tools as the chat template gets them, and the names of the strict ones."""
    """OpenAI's function tools, checked; each keeps name, description and parameters."""
    if value is None or value == []:
        return None, ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise bad(f"'tools' must be a list of up to {MAX_TOOLS} function tools", "tools")
    tools, names, strict = [], set(), []
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad(f"{at}.type must be 'function' (the only kind served)", f"{at}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad(f"{at}.function must be an object", f"{at}.function")
        name = tool_name(function.get("name"), f"{at}.function.name")
        if name in names:
            raise bad(f"{at}.function.name {name!r} is given twice", f"{at}.function.name")
        names.add(name)
        kept: dict[str, Any] = {"name": name}
        for key, types in (("description", str), ("parameters", dict)):
            if function.get(key) is not None:
                if not isinstance(function[key], types):
                    raise bad(f"{at}.function.{key} has the wrong type", f"{at}.function.{key}")
                kept[key] = function[key]
        if strict_flag(function.get("strict"), f"{at}.function.strict"):
            params = kept.get("parameters", {"type": "object", "properties": {}})
            kept["parameters"] = strict_schema(params, f"{at}.function.parameters")
            strict.append(name)
        tools.append({"type": "function", "function": kept})
    return tuple(tools), tuple(strict)


def _tool_choice(value: Any) -> ToolChoice | None:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return {"name": tool_name(name, "tool_choice.function.name")}
    raise bad(
        "'tool_choice' must be 'auto', 'none', 'required' or "
        '{"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


def _chat_logprobs(raw: dict[str, Any]) -> int | None:
    wanted = raw.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad("'logprobs' must be true or false", "logprobs")
    top = integer(raw, "top_logprobs", None, 0, MAX_TOP_LOGPROBS["chat"])
    if top is not None and not wanted:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else None


def parse_chat(body: bytes) -> GenerateRequest:
    """POST /v1/chat/completions."""
    raw = parse_body(body)
    messages = raw.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of {role, content}", "messages")
    checked = tuple(_message(m, i) for i, m in enumerate(messages))
    common = _common(raw, "chat")
    tools, strict = _tools(raw.get("tools"))
    parallel = raw.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    return GenerateRequest(
        **common,
        messages=checked,
        tools=tools,
        tool_choice=checked_choice(_tool_choice(raw.get("tool_choice")), tools, "tool_choice"),
        parallel_tool_calls=parallel if tools else None,
        strict_tools=strict or None,
        logprobs=_chat_logprobs(raw),
        n=int(integer(raw, "n", 1, 1, MAX_CHOICES) or 1),
    )


def parse_completion(body: bytes) -> GenerateRequest:
    """POST /v1/completions: one prompt, as a string or token ids."""
    raw = parse_body(body)
    prompt = raw.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    _refuse_non_neutral(raw, COMPLETION_NEUTRAL)
    common = _common(raw, "completion")
    common["logprobs"] = integer(raw, "logprobs", None, 0, MAX_TOP_LOGPROBS["completion"])
    if isinstance(prompt, str) and prompt:
        return GenerateRequest(**common, prompt=prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return GenerateRequest(**common, prompt_ids=tuple(prompt))
    raise bad("'prompt' must be one non-empty string or one list of token ids", "prompt")
