"""Anthropic's Messages API on `mlx-cluster serve`, end to end: the real server (`--local 2`,
tiny model) driven by the official `anthropic` client and raw sockets — the same text streamed
or not, Anthropic's event order, forced tool use and structured output valid for their schemas,
count_tokens, both key headers, errors in Anthropic's shape. (The pure halves:
test_serve_anthropic_shapes.py.)
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import pytest
from api_cases import ADD, USER, WEATHER, keyed_server
from api_cases import ANTHROPIC_TOOLS as TOOLS
from launch_helpers import tiny_model
from serve_helpers import Server

__all__ = ["tiny_model"]  # the fixture

KEY = "anthropic-key"


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    yield from keyed_server(tiny_model, KEY)


def _client(s: Server, key: str = KEY) -> anthropic.Anthropic:
    """The official client pointed at the cluster (it sends `x-api-key`)."""
    return anthropic.Anthropic(
        base_url=s.url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=60
    )


GREEDY = {"temperature": 0}  # this client version no longer has a temperature argument


def test_streamed_and_not_give_the_same_message(server: Server) -> None:
    client = _client(server)
    fields: Any = {"model": "m", "max_tokens": 12, "messages": USER, "extra_body": GREEDY}
    whole = client.messages.create(**fields, system="Be brief.")
    assert whole.id.startswith("msg_") and whole.type == "message" and whole.role == "assistant"
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 12
    assert [b.type for b in whole.content] == ["text"]
    names = []
    with client.messages.stream(**fields, system="Be brief.") as stream:
        for event in stream:
            names.append(event.type)
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "text", None)) for b in final.content] == [
        (b.type, getattr(b, "text", None)) for b in whole.content
    ]
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12
    raw = [n for n in names if n not in ("text",)]  # the helper's own derived events
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    # The same conversation through the OpenAI route: the same template, the same text.
    openai_text = server.client(KEY).chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "Be brief."}, *USER],
        max_tokens=12,
        temperature=0,
    )
    block = whole.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == openai_text.choices[0].message.content


def test_stop_sequences_end_the_text(server: Server) -> None:
    client = _client(server)
    text = client.messages.create(model="m", max_tokens=30, messages=USER, extra_body=GREEDY)
    first = text.content[0]
    assert isinstance(first, anthropic.types.TextBlock) and len(first.text) > 10
    stop = first.text[5:8]
    cut = client.messages.create(
        model="m", max_tokens=30, messages=USER, extra_body=GREEDY, stop_sequences=[stop]
    )
    block = cut.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == first.text[: first.text.index(stop)]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_use_validates(server: Server, stream: bool) -> None:
    client = _client(server)
    fields: Any = {"model": "m", "max_tokens": 200, "messages": USER, "extra_body": GREEDY}
    fields |= {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "add"}}
    if stream:
        with client.messages.stream(**fields) as events:
            kinds = [e.type for e in events]
            message = events.get_final_message()
        assert "input_json" in kinds  # the helper's event for input_json_delta
    else:
        message = client.messages.create(**fields)
    assert message.stop_reason == "tool_use"
    uses = [b for b in message.content if isinstance(b, anthropic.types.ToolUseBlock)]
    assert len(uses) == 1 and uses[0].name == "add" and uses[0].id
    jsonschema.validate(uses[0].input, ADD)


def test_tool_result_round_trip(server: Server) -> None:
    messages: Any = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}],
        },
    ]
    out = _client(server).messages.create(
        model="m", max_tokens=5, messages=messages, tools=TOOLS, extra_body=GREEDY
    )
    assert out.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in out.content] == ["text"]


def test_count_tokens_equals_the_requests_input(server: Server) -> None:
    client = _client(server)
    fields: Any = {"model": "m", "messages": USER, "system": "Count me.", "tools": TOOLS}
    counted = client.messages.count_tokens(**fields)
    out = client.messages.create(**fields, max_tokens=2, extra_body=GREEDY)
    assert counted.input_tokens > 0
    assert counted.input_tokens == out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)


def test_keys_both_ways_and_anthropic_errors(server: Server) -> None:
    with pytest.raises(anthropic.AuthenticationError):
        _client(server, "wrong").messages.create(model="m", max_tokens=2, messages=USER)
    body = json.dumps({"model": "m", "max_tokens": 2, "messages": USER}).encode()
    bearer = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    status, answer = server.request("POST", "/v1/messages", body, bearer)
    assert status == 200 and answer["type"] == "message"
    status, answer = server.request("POST", "/v1/messages", body)
    assert status == 401
    assert answer == {
        "type": "error",
        "error": {"type": "authentication_error", "message": answer["error"]["message"]},
    }
    headers = {
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "Content-Type": "application/json",
    }
    status, answer = server.request("POST", "/v1/messages", b'{"messages": []}', headers)
    assert status == 400 and answer["type"] == "error"
    assert (
        answer["error"]["type"] == "invalid_request_error"
        and "messages" in answer["error"]["message"]
    )
    status, answer = server.request("POST", "/v1/messages/batches", b"{}", headers)
    assert (status, answer["error"]["type"]) == (404, "not_found_error")
    status, answer = server.request("GET", "/v1/messages", headers=headers)
    assert (status, answer["type"]) == (405, "error")


def test_bad_requests_through_the_client(server: Server) -> None:
    client = _client(server)
    image: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": [image]}]
        )
    assert "messages[0].content[0]" in caught.value.message and "image" in caught.value.message
    unsupported = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="m",
            max_tokens=20,
            messages=USER,
            tools=[{"name": "f", "input_schema": unsupported}],
            tool_choice={"type": "any"},
        )
    assert "uniqueItems" in caught.value.message
    error: Any = caught.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert server.health()[0] == 200


def test_structured_output(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "maxItems": 3,
            },
        },
        "required": ["answer", "scores"],
        "additionalProperties": False,
    }
    out = _client(server).messages.create(
        model="m",
        max_tokens=200,
        messages=USER,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )
    block = out.content[0]
    assert out.stop_reason == "end_turn" and isinstance(block, anthropic.types.TextBlock)
    jsonschema.validate(json.loads(block.text), schema)


def test_auto_with_a_strict_tool_answers_the_format_or_a_valid_call(server: Server) -> None:
    """tool_choice auto, a strict tool and output_config: every answer is that JSON or one
    tool_use whose input validates against the closed schema (bounded: a city of at most 12
    characters and an enum, so a random model's call ends), never anything else."""
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    weather = {"name": "get_weather", "input_schema": WEATHER, "strict": True}
    kinds = set()
    for question in ("Hello world", "Add 2 and 3", "What now?", "Sum these", "Weather?"):
        out = _client(server).messages.create(
            model="m", max_tokens=200, tools=[weather],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": question}],
            output_config={"format": {"type": "json_schema", "schema": answer}},
            extra_body=GREEDY,
        )  # fmt: skip
        uses = [b for b in out.content if isinstance(b, anthropic.types.ToolUseBlock)]
        if uses:
            (use,) = uses
            assert out.stop_reason == "tool_use" and use.name == "get_weather", out
            jsonschema.validate(use.input, WEATHER)
            kinds.add("tool_use")
        else:
            (block,) = out.content
            assert out.stop_reason == "end_turn" and isinstance(block, anthropic.types.TextBlock)
            jsonschema.validate(json.loads(block.text), answer)
            kinds.add("text")
    assert "tool_use" in kinds, kinds  # the strict call was made, and checked


def _raw_stream(s: Server, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The event names and bodies of a streamed /v1/messages, read off the socket."""
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    headers = {
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "Content-Type": "application/json",
    }
    try:
        conn.request("POST", "/v1/messages", json.dumps({**body, "stream": True}), headers)
        response = conn.getresponse()
        assert response.status == 200 and response.headers["Content-Type"].startswith(
            "text/event-stream"
        )
        frames = response.read().decode().split("\n\n")
    finally:
        conn.close()
    events = []
    for frame in filter(None, frames):
        lines = dict(line.split(": ", 1) for line in frame.split("\n") if not line.startswith(":"))
        if "event" in lines:  # not a comment (a long prompt's progress)
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_raw_event_sequence(server: Server) -> None:
    body = {
        "model": "m",
        "max_tokens": 6,
        "messages": USER,
        "tools": TOOLS,
        "temperature": 0,
    }
    text = _raw_stream(server, body)
    names = [name for name, _ in text]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[3:-3] == ["content_block_delta"] * (len(names) - 6)
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert (
        text[-2][1]["delta"]["stop_reason"] == "max_tokens"
        and text[-2][1]["usage"]["output_tokens"] == 6
    )
    forced = _raw_stream(
        server, {**body, "max_tokens": 200, "tool_choice": {"type": "tool", "name": "add"}}
    )
    names = [name for name, _ in forced]
    # the call's input streams as it is generated: one input_json_delta per piece
    deltas = names[3:-3]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert len(deltas) > 2 and set(deltas) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert forced[2][1]["content_block"]["type"] == "tool_use"
    assert {body["delta"]["type"] for _, body in forced[3:-3]} == {"input_json_delta"}
    partial_json = "".join(body["delta"]["partial_json"] for _, body in forced[3:-3])
    jsonschema.validate(json.loads(partial_json), ADD)
    assert forced[-2][1]["delta"]["stop_reason"] == "tool_use"
