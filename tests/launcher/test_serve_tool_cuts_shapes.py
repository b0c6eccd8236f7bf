"""The pure halves of tool calls cut by max_tokens and of strict mode: rank 0's call events (a
start, then the arguments as they grow) shaped into OpenAI's and Anthropic's answers and streams;
the object a cut call's arguments were becoming (against jiter, the partial JSON parser the
`anthropic` client itself uses); strict schemas closed, or refused with a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

import jiter
import pytest

from launcher.serve.anthropic_api import parse_messages
from launcher.serve.anthropic_bodies import AnthropicAnswer
from launcher.serve.openai_api import parse_chat
from launcher.serve.openai_bodies import OpenAIAnswer
from launcher.serve.partial_json import partial_object
from launcher.serve.request_api import ApiError

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]
PIECES = ['{"', "city", '":', ' "', "Par"]  # a forced call's arguments cut by max_tokens
CUT_EVENTS: list[dict[str, Any]] = [
    {"event": "begin", "prompt_tokens": 9},
    {"event": "tool_call", "call": {"id": "call_1", "name": "get_weather", "arguments": PIECES[0]}},
    *({"event": "tool_call", "arguments": p} for p in PIECES[1:]),
    {"event": "done", "finish_reason": "length", "prompt_tokens": 9, "completion_tokens": 16},
]


def _sse(frames: list[bytes]) -> list[tuple[str | None, dict[str, Any]]]:
    out: list[tuple[str | None, dict[str, Any]]] = []
    for frame in b"".join(frames).decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if lines.get("data", "[DONE]") != "[DONE]":
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def _chat(**fields: Any) -> Any:
    body = {"model": "m", "messages": USER, "tools": TOOLS, "tool_choice": "required", **fields}
    return parse_chat(json.dumps(body).encode())


def test_openai_streams_a_cut_call_as_it_grows() -> None:
    answer = OpenAIAnswer(_chat(stream=True), "chatcmpl-1", "m")
    frames = answer.opening() + [f for e in CUT_EVENTS for f in answer.feed(e)] + answer.closing()
    deltas = [c["choices"][0] for _, c in _sse(frames) if c["choices"]]
    calls = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert calls[0] == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"'},
    }
    assert calls[1:] == [{"index": 0, "function": {"arguments": p}} for p in PIECES[1:]]
    assert deltas[-1]["finish_reason"] == "length"
    assert not any(d["delta"].get("content") for d in deltas)


def test_openai_answers_a_cut_call_as_a_call() -> None:
    answer = OpenAIAnswer(_chat(), "chatcmpl-1", "m")
    for event in CUT_EVENTS:
        answer.feed(event)
    choice = answer.body()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": "".join(PIECES)},
        }
    ]


def _anthropic(**fields: Any) -> Any:
    tools = [{"name": "get_weather", "input_schema": CITY}]
    body = {"model": "m", "max_tokens": 16, "messages": USER, "tools": tools, **fields}
    return parse_messages(json.dumps({**body, "tool_choice": {"type": "any"}}).encode())


def test_anthropic_streams_a_cut_call_as_a_tool_use_block() -> None:
    answer = AnthropicAnswer(_anthropic(stream=True), "msg_1", "m")
    events = _sse([f for e in CUT_EVENTS for f in answer.feed(e)])
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * len(PIECES),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    block = events[2][1]["content_block"]
    assert block == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    partial = [
        body["delta"]["partial_json"] for name, body in events if name == "content_block_delta"
    ]
    assert partial == PIECES
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_anthropic_answers_a_cut_call_with_the_object_so_far() -> None:
    answer = AnthropicAnswer(_anthropic(), "msg_1", "m")
    for event in CUT_EVENTS:
        answer.feed(event)
    body = answer.body()
    assert body["stop_reason"] == "max_tokens"
    assert body["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Par"}}
    ]


def test_a_whole_call_still_ends_as_tool_use() -> None:
    answer = AnthropicAnswer(_anthropic(), "msg_1", "m")
    call = {"id": "c", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    answer.feed({"event": "tool_call", "call": call})
    answer.feed({"event": "done", "finish_reason": "tool_calls", "completion_tokens": 9})
    assert answer.body()["stop_reason"] == "tool_use"
    assert answer.body()["content"][0]["input"] == {"city": "Paris"}


WHOLE = [
    '{"city": "Paris", "unit": "celsius", "days": [1, 2.5, {"x": true, "y": null}], "z": {}}',
    '{"s": "a\\"b\\u00e9c\\n", "e": -12.5e3, "f": false, "nested": {"list": [[], ["x"]]}}',
]


@pytest.mark.parametrize("whole", WHOLE)
def test_a_cut_object_is_what_jiter_makes_of_it(whole: str) -> None:
    """Every prefix: the same object as jiter's trailing-strings mode (an open string closed,
    a key without its value and a half-written number or literal dropped)."""
    for k in range(1, len(whole) + 1):
        expected = jiter.from_json(whole[:k].encode(), partial_mode="trailing-strings")
        assert partial_object(whole[:k]) == expected, whole[:k]


def test_what_is_no_object_gives_an_empty_one() -> None:
    assert partial_object("") == {} and partial_object("[1, 2") == {}
    assert partial_object('"text') == {} and partial_object("{]") == {}
    assert partial_object('{"a": 1}}') == {}


# --- strict mode ---------------------------------------------------------------------------------


def _strict_tool(parameters: dict[str, Any], strict: Any = True) -> dict[str, Any]:
    function = {"name": "get_weather", "parameters": parameters, "strict": strict}
    return {"type": "function", "function": function}


def _parameters(request: Any) -> dict[str, Any]:
    line = json.loads(request.rank_line("chatcmpl-1", seed=1))
    parameters: dict[str, Any] = line["tools"][0]["function"]["parameters"]
    return parameters


NESTED = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
        "days": {"type": "array", "items": {"$ref": "#/$defs/day"}},
        "unit": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {}}]},
    },
    "required": ["city", "where", "days", "unit"],
    "$defs": {
        "day": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    },
}


def test_strict_closes_every_object() -> None:
    closed = _parameters(_chat(tools=[_strict_tool(NESTED)]))
    assert closed["additionalProperties"] is False
    assert closed["properties"]["where"]["additionalProperties"] is False
    assert closed["$defs"]["day"]["additionalProperties"] is False
    assert closed["properties"]["unit"]["anyOf"][1]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["city"]


def test_without_strict_the_schema_is_as_given() -> None:
    assert _parameters(_chat(tools=[_strict_tool(NESTED, strict=False)])) == NESTED


def test_rank_0_learns_which_tools_are_strict_and_the_template_sees_no_flag() -> None:
    """The strict names travel beside the tools (auto mode then holds any call to its schema);
    the tools themselves go to the chat template as they were, with no `strict` key added."""
    loose = {"type": "function", "function": {"name": "get_time", "parameters": CITY}}
    line = json.loads(_chat(tools=[_strict_tool(CITY), loose]).rank_line("c", seed=1))
    assert line["strict_tools"] == ["get_weather"]
    assert all("strict" not in t["function"] for t in line["tools"])
    plain = json.loads(_chat(tools=[loose]).rank_line("c", seed=1))
    assert "strict_tools" not in plain


@pytest.mark.parametrize(
    ("schema", "param", "words"),
    [
        (
            {**CITY, "properties": {**CITY["properties"], "unit": {"type": "string"}}},
            "tools[0].function.parameters.required",
            "'unit' is missing",
        ),
        (
            {**NESTED, "$defs": {"day": {"type": "object", "properties": {"n": {}}}}},
            "tools[0].function.parameters.$defs.day.required",
            "'n' is missing",
        ),
        (
            {**CITY, "additionalProperties": True},
            "tools[0].function.parameters.additionalProperties",
            "must be false",
        ),
    ],
)
def test_a_schema_strict_mode_refuses_is_a_400_naming_it(
    schema: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(ApiError) as e:
        _chat(tools=[_strict_tool(schema)])
    assert e.value.status == 400 and e.value.param == param and words in e.value.message


def test_strict_must_be_a_boolean() -> None:
    with pytest.raises(ApiError) as e:
        _chat(tools=[_strict_tool(CITY, strict="yes")])
    assert e.value.param == "tools[0].function.strict"


def test_strict_response_format_follows_the_same_rules() -> None:
    def fmt(schema: dict[str, Any], strict: bool) -> dict[str, Any]:
        spec = {"name": "w", "schema": schema, "strict": strict}
        body = {
            "model": "m",
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": spec},
        }
        line = json.loads(parse_chat(json.dumps(body).encode()).rank_line("c", seed=1))
        result: dict[str, Any] = line["response_format"]["schema"]
        return result

    assert fmt(CITY, True) == {**CITY, "additionalProperties": False}
    assert fmt(CITY, False) == CITY
    loose = {**CITY, "required": []}
    assert fmt(loose, False) == loose
    with pytest.raises(ApiError) as e:
        fmt(loose, True)
    assert e.value.param == "response_format.json_schema.schema.required"


def test_anthropic_strict_tools_follow_the_same_rules() -> None:
    tool = {"name": "get_weather", "input_schema": CITY, "strict": True}
    body = {"model": "m", "max_tokens": 8, "messages": USER, "tools": [tool]}
    line = json.loads(parse_messages(json.dumps(body).encode()).rank_line("m", seed=1))
    assert line["tools"][0]["function"]["parameters"] == {**CITY, "additionalProperties": False}
    assert line["strict_tools"] == ["get_weather"]
    tool["input_schema"] = {**CITY, "required": []}
    with pytest.raises(ApiError) as e:
        parse_messages(json.dumps(body).encode())
    assert e.value.param == "tools[0].input_schema.required"
