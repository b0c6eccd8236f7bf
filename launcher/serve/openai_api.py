"""The OpenAI requests of `mlx-cluster serve`: /v1/chat/completions and /v1/completions bodies,
checked against their declared models (openai_models.py), turned into GenerateRequest
(request_api.py); the answers' shapes are openai_bodies.py.

A bad body raises ApiError naming the field (request_errors.py), which the HTTP layer turns into
OpenAI's error object {"error": {"message", "type", "param", "code"}}. What is left here is what
no declaration says: defaults, the chat template's message form, strict mode's schemas, and a
tool_choice checked against the tools given. Sampling defaults follow OpenAI's: temperature 1,
top_p 1, max_tokens 16 for completions.
"""

from __future__ import annotations

from typing import Any

from launcher.serve.openai_models import (
    PARAMS,
    AssistantMessage,
    ChatBody,
    ChatMessage,
    CompletionBody,
    FunctionTool,
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedChoice,
    OpenAIBody,
    TextPart,
    ToolCall,
    ToolMessage,
)
from launcher.serve.request_api import (
    ApiError,
    GenerateRequest,
    ToolChoice,
    arguments_value,
    checked_choice,
    new_id,
)
from launcher.serve.request_errors import validated
from launcher.serve.strict_schema import strict_schema

__all__ = ["ApiError", "GenerateRequest", "new_id", "parse_chat", "parse_completion"]

CHAT_MAX_TOKENS = 512  # OpenAI has no fixed chat default; mlx-lm's server uses 512
COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions


def parse_chat(body: bytes) -> GenerateRequest:
    """POST /v1/chat/completions."""
    chat = validated(ChatBody, body, PARAMS)
    tools, strict = _tools(chat.tools)
    return GenerateRequest(
        **_common(chat, "chat", CHAT_MAX_TOKENS),
        messages=tuple(_message(m) for m in chat.messages),
        tools=tools,
        tool_choice=checked_choice(_choice(chat.tool_choice), tools, "tool_choice"),
        parallel_tool_calls=chat.parallel_tool_calls if tools else None,
        strict_tools=strict or None,
        logprobs=(chat.top_logprobs or 0) if chat.logprobs else None,
        n=chat.n,
    )


def parse_completion(body: bytes) -> GenerateRequest:
    """POST /v1/completions: one prompt, as a string or token ids."""
    completion = validated(CompletionBody, body, PARAMS)
    common = _common(completion, "completion", COMPLETION_MAX_TOKENS)
    common["logprobs"] = completion.logprobs
    if isinstance(completion.prompt, str):
        return GenerateRequest(**common, prompt=completion.prompt)
    return GenerateRequest(**common, prompt_ids=tuple(completion.prompt))


def _common(body: OpenAIBody, kind: str, default_max_tokens: int) -> dict[str, Any]:
    """The options both routes share."""
    options = body.stream_options
    return {
        "kind": kind,
        "max_tokens": body.max_completion_tokens or body.max_tokens or default_max_tokens,
        # Not asked for: rank 0 shrinks it to the context the prompt leaves (else refuses).
        "max_tokens_default": body.max_tokens is None and body.max_completion_tokens is None,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": tuple(body.stop),
        "stream": body.stream,
        "include_usage": options is not None and options.include_usage,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        # 1 changes nothing
        "repetition_penalty": None if body.repetition_penalty == 1 else body.repetition_penalty,
        "logit_bias": {str(int(token)): b for token, b in body.logit_bias.items()} or None,
        "response_format": _response_format(body),
        "prediction": _text(body.prediction.content) or None if body.prediction else None,
    }


def _response_format(body: OpenAIBody) -> dict[str, Any] | None:
    """OpenAI's response_format, normalized for rank 0: the JSON schema itself under "schema"."""
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return {"type": "json_object"}
    if not isinstance(fmt, JsonSchemaFormat):
        return None  # none, or "text"
    spec = fmt.json_schema
    schema = spec.schema_
    if spec.strict:
        schema = strict_schema(schema, "response_format.json_schema.schema")
    return {"type": "json_schema", "schema": schema}


def _text(content: str | list[TextPart]) -> str:
    """A message's content: a string, or its text parts joined."""
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _call(call: ToolCall) -> dict[str, Any]:
    """An assistant's earlier tool call, as chat templates take it (arguments parsed)."""
    function = {"name": call.function.name, "arguments": arguments_value(call.function.arguments)}
    return {"id": call.id, "type": "function", "function": function}


def _message(m: ChatMessage) -> dict[str, Any]:
    """One chat message in the Hugging Face form chat templates expect."""
    if isinstance(m, AssistantMessage):
        text = None if m.content is None else _text(m.content)
        if m.tool_calls is None:
            return {"role": "assistant", "content": text or ""}
        calls = [_call(call) for call in m.tool_calls]
        return {"role": "assistant", "content": text, "tool_calls": calls}
    if isinstance(m, ToolMessage):
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": _text(m.content)}
    # Templates know "system"; "developer" is OpenAI's newer name for it.
    return {"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}


def _choice(choice: str | NamedChoice | None) -> ToolChoice | None:
    return choice if choice is None or isinstance(choice, str) else {"name": choice.function.name}


def _tools(value: list[FunctionTool]) -> tuple[tuple[dict[str, Any], ...] | None, tuple[str, ...]]:
    """The tools as the chat template gets them (name, description, parameters), and the names
    of the strict ones, whose parameters strict mode closes."""
    if not value:
        return None, ()
    tools, strict = [], []
    for i, tool in enumerate(value):
        function = tool.function
        kept: dict[str, Any] = {"name": function.name}
        if function.description is not None:
            kept["description"] = function.description
        if function.parameters is not None:
            kept["parameters"] = function.parameters
        if function.strict:
            params = kept.get("parameters", {"type": "object", "properties": {}})
            kept["parameters"] = strict_schema(params, f"tools[{i}].function.parameters")
            strict.append(function.name)
        tools.append({"type": "function", "function": kept})
    return tuple(tools), tuple(strict)
