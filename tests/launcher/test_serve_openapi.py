"""The declared request bodies of `mlx-cluster serve`: GET /openapi.json describes the four
generate routes with the schemas that check every body (an OpenAPI 3.1 document, checked with
`jsonschema`), and a bad field deep in a body is a 400 whose message names pydantic's location
of it, in OpenAI's error shape (with `param`) and in Anthropic's. The real server, then the
parse functions alone.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from api_cases import ADD, ANTHROPIC_TOOLS, TOOLS, USER
from launch_helpers import tiny_model
from serve_helpers import Server, serving

from launcher.serve.anthropic_api import parse_count_tokens, parse_messages
from launcher.serve.openai_api import parse_chat, parse_completion
from launcher.serve.request_api import ApiError, GenerateRequest

__all__ = ["tiny_model"]  # the fixture

KEY = "openapi-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
PARSE: dict[str, Callable[[bytes], GenerateRequest]] = {
    "/v1/chat/completions": parse_chat,
    "/v1/completions": parse_completion,
    "/v1/messages": parse_messages,
    "/v1/messages/count_tokens": parse_count_tokens,
}
ROUTES = {
    "/v1/chat/completions": "ChatBody",
    "/v1/completions": "CompletionBody",
    "/v1/messages": "MessagesBody",
    "/v1/messages/count_tokens": "CountTokensBody",
}
# The parts of an OpenAPI 3.1 document this one must have, as a JSON schema.
OPENAPI = {
    "type": "object",
    "required": ["openapi", "info", "paths", "components"],
    "properties": {
        "openapi": {"type": "string", "pattern": r"^3\.1\.\d+$"},
        "info": {
            "type": "object",
            "required": ["title", "version"],
            "properties": {"title": {"type": "string"}, "version": {"type": "string"}},
        },
        "paths": {
            "type": "object",
            "propertyNames": {"pattern": "^/"},
            "additionalProperties": {
                "type": "object",
                "propertyNames": {"enum": ["get", "put", "post", "delete", "patch", "head"]},
                "additionalProperties": {"$ref": "#/$defs/operation"},
            },
        },
        "components": {
            "type": "object",
            "properties": {
                "schemas": {"type": "object", "additionalProperties": {"type": "object"}},
                "securitySchemes": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {"type": {"enum": ["apiKey", "http"]}},
                    },
                },
            },
        },
    },
    "$defs": {
        "media": {
            "type": "object",
            "required": ["content"],
            "properties": {
                "content": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["schema"],
                        "properties": {"schema": {"type": "object"}},
                    },
                }
            },
        },
        "operation": {
            "type": "object",
            "required": ["requestBody", "responses"],
            "properties": {
                "operationId": {"type": "string"},
                "requestBody": {"$ref": "#/$defs/media"},
                "responses": {
                    "type": "object",
                    "minProperties": 1,
                    "propertyNames": {"pattern": "^([1-5][0-9]{2}|default)$"},
                    "additionalProperties": {"type": "object", "required": ["description"]},
                },
                "security": {"type": "array", "items": {"type": "object"}},
            },
        },
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
GOOD_CHAT = {
    "model": "m",
    "messages": [
        {"role": "developer", "content": "Be brief."},
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "3"}]},
    ],
    "tools": TOOLS,
    "tool_choice": {"type": "function", "function": {"name": "add"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ADD}},
    "stream": True,
    "stream_options": {"include_usage": True},
    "stop": "\n\n",
    "logprobs": True,
    "top_logprobs": 2,
    "logit_bias": {"42": -100},
}
GOOD_MESSAGES = {
    "model": "m",
    "max_tokens": 8,
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        *USER,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    ],
    "tools": ANTHROPIC_TOOLS,
    "tool_choice": {"type": "tool", "name": "add"},
    "output_config": {"format": {"type": "json_schema", "schema": ADD}},
}
GOOD = [
    ("/v1/chat/completions", GOOD_CHAT),
    ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 3}),
    ("/v1/messages", GOOD_MESSAGES),
    ("/v1/messages/count_tokens", {"messages": USER, "tools": ANTHROPIC_TOOLS}),
]
BAD = [
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": USER, "n": 9}),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("/v1/chat/completions", {"messages": USER, "tools": [{"type": "custom"}]}),
    ("/v1/completions", {"prompt": "x", "best_of": 2}),
    ("/v1/messages", {"messages": USER}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "x"}]}]}),
    ("/v1/messages/count_tokens", {"messages": USER, "tool_choice": {"type": "sometimes"}}),
]
# A bad field deep in a body: (parse, body, OpenAI's `param`, the location the message names).
TWICE = {"name": TOOLS[0]["function"]["name"]}
CHAT_CALL = {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "a b"}}]}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": "{}"}
NESTED: list[tuple[Callable[[bytes], GenerateRequest], dict[str, Any], str, str]] = [
    (
        parse_chat,
        {"messages": [*USER, CHAT_CALL]},
        "messages[1].tool_calls[0].function.name",
        "messages[1].tool_calls[0].function.name",
    ),
    (
        parse_chat,
        {"messages": USER, "tools": [TOOLS[0], {"type": "function", "function": TWICE}]},
        "tools[1].function.name",
        "tools[1].function.name",
    ),
    (
        parse_chat,
        {"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]},
        "tools[0].function.strict",
        "tools[0].function.strict",
    ),
    (
        parse_chat,
        {
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": {"schema": 1}},
        },
        "response_format.json_schema.schema",
        "response_format.json_schema.schema",
    ),
    (
        parse_chat,
        {"messages": USER, "prediction": {"type": "content", "content": [{"type": "image_url"}]}},
        "prediction.content[0].type",
        "prediction.content[0].type",
    ),
    (
        parse_chat,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages",  # as OpenAI names it: the whole list
        "messages[0].content[0].text",
    ),
    (parse_completion, {"prompt": [[1, -2]]}, "prompt", "prompt[1]"),
    (
        parse_messages,
        {"max_tokens": 8, "messages": [*USER, {"role": "assistant", "content": [TOOL_USE]}]},
        "messages[1].content[0].input",
        "messages[1].content[0].input",
    ),
    (
        parse_messages,
        {
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "3"}, {"type": "document"}],
                        }
                    ],
                }
            ],
        },
        "messages[0].content[0].content[1].type",
        "messages[0].content[0].content[1].type",
    ),
    (
        parse_count_tokens,
        {"messages": USER, "tools": [{**ANTHROPIC_TOOLS[0], "input_schema": [1]}]},
        "tools[0].input_schema",
        "tools[0].input_schema",
    ),
    (
        parse_count_tokens,
        {"messages": USER, "system": [{"type": "text", "text": "a"}, {"type": "text"}]},
        "system[1].text",
        "system[1].text",
    ),
]


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with serving("--local", "1", "--model", str(tiny_model), "--api-key", KEY) as s:
        s.wait_ready()
        yield s
        assert "Traceback" not in s.stderr, s.stderr


@pytest.fixture(scope="module")
def document(server: Server) -> dict[str, Any]:
    status, body = server.request("GET", "/openapi.json")  # no key: it holds no data
    assert status == 200, body
    return body


def _validator(document: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """The request schema `name`, its references resolved inside the document."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(schema)


def test_openapi_json_describes_the_four_generate_routes(document: dict[str, Any]) -> None:
    jsonschema.validate(document, OPENAPI)
    schemas = document["components"]["schemas"]
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    assert set(document["paths"]) == set(ROUTES)
    for path, name in ROUTES.items():
        (method,) = document["paths"][path]
        operation = document["paths"][path][method]
        assert method == "post"
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
        assert {"bearer", "x-api-key"} <= {k for s in operation["security"] for k in s}
        error = operation["responses"]["default"]["content"]["application/json"]["schema"]
        assert error["$ref"].split("/")[-1] in schemas
    required = {name: set(schemas[name].get("required", [])) for name in ROUTES.values()}
    assert required == {
        "ChatBody": {"messages"},
        "CompletionBody": {"prompt"},
        "MessagesBody": {"messages", "max_tokens"},
        "CountTokensBody": {"messages"},
    }
    assert {"tools", "tool_choice", "response_format", "logprobs"} <= set(
        schemas["ChatBody"]["properties"]
    )
    assert {"system", "stop_sequences", "output_config"} <= set(
        schemas["MessagesBody"]["properties"]
    )


@pytest.mark.parametrize(("path", "body"), GOOD, ids=[p for p, _ in GOOD])
def test_the_schema_takes_what_the_server_takes(
    document: dict[str, Any], path: str, body: dict[str, Any]
) -> None:
    _validator(document, ROUTES[path]).validate(body)
    PARSE[path](json.dumps(body).encode())  # no ApiError


@pytest.mark.parametrize(("path", "body"), BAD)
def test_the_schema_refuses_what_the_server_refuses(
    server: Server, document: dict[str, Any], path: str, body: dict[str, Any]
) -> None:
    assert not _validator(document, ROUTES[path]).is_valid(body)
    status, answer = server.request("POST", path, json.dumps(body).encode(), AUTH)
    assert status == 400, answer


def test_a_nested_bad_field_is_named_in_openais_error(server: Server) -> None:
    body = {"messages": [*USER, CHAT_CALL], "max_tokens": 2}
    status, answer = server.request("POST", "/v1/chat/completions", json.dumps(body).encode(), AUTH)
    where = "messages[1].tool_calls[0].function.name"
    assert status == 400 and set(answer) == {"error"}, answer
    error = answer["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", where, None)
    assert f"'{where}'" in error["message"] and "letters, digits" in error["message"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_nested_bad_field_is_named_in_anthropics_error(server: Server, path: str) -> None:
    body = {"max_tokens": 8, "messages": [*USER, {"role": "assistant", "content": [TOOL_USE]}]}
    status, answer = server.request("POST", path, json.dumps(body).encode(), AUTH)
    assert status == 400, answer
    assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}
    assert answer["error"]["type"] == "invalid_request_error"
    assert "'messages[1].content[0].input' must be an object" in answer["error"]["message"]


# --- the parse functions alone ------------------------------------------------------------------


@pytest.mark.parametrize(("parse", "body", "param", "where"), NESTED)
def test_the_message_names_pydantics_location(
    parse: Callable[[bytes], GenerateRequest], body: dict[str, Any], param: str, where: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse(json.dumps(body).encode())
    assert caught.value.status == 400
    assert caught.value.param == param, caught.value.message
    assert caught.value.message.startswith(f"'{where}' "), caught.value.message


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"messages": [', "not valid JSON"),
        (b"[" * 100_000, "nested too deeply"),  # refused while parsing, before any work
        (b'"a string"', "must be a JSON object"),
        (b'{"messages": [{"role": "user", "content": "\xff"}]}', "not valid JSON"),
    ],
)
def test_a_body_that_is_no_object_names_no_field(body: bytes, words: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat(body)
    assert (caught.value.status, caught.value.param) == (400, None)
    assert words in caught.value.message


def test_null_is_a_field_left_out() -> None:
    """As OpenAI's SDKs send unset options: a top-level null takes the default."""
    line = json.loads(
        parse_chat(
            json.dumps({"messages": USER, "temperature": None, "stop": None, "n": None}).encode()
        ).rank_line("c", seed=1)
    )
    assert (line["temperature"], line["stop"], line.get("n")) == (1.0, [], None)


def test_a_typical_body_is_checked_in_well_under_a_millisecond() -> None:
    body = json.dumps({**GOOD_CHAT, "tools": TOOLS[:1], "tool_choice": "auto"}).encode()
    parse_chat(body)
    seconds = min(timeit.repeat(lambda: parse_chat(body), number=200, repeat=5)) / 200
    assert seconds < 1e-3, f"{seconds * 1e6:.0f} µs per body"
