"""The pure halves of Anthropic's Messages API on `mlx-cluster serve`: /v1/messages and
/v1/messages/count_tokens bodies converted into the same rank line as an OpenAI chat request
(every bad field a 400 naming it, in Anthropic's error shape), and rank 0's events shaped into
Anthropic's message and event stream.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from api_cases import ADD
from api_cases import ANTHROPIC_TOOLS as TOOLS

from launcher.serve.anthropic_api import error_body, parse_count_tokens, parse_messages
from launcher.serve.anthropic_bodies import AnthropicAnswer, CountAnswer
from launcher.serve.request_api import ApiError, GenerateRequest


def _messages(**fields: Any) -> GenerateRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    return parse_messages(json.dumps({**body, **fields}).encode())


def _line(request: GenerateRequest) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(request.rank_line("msg_1", seed=7))
    return line


# --- requests → rank 0's line -------------------------------------------------------------------


def test_a_conversation_becomes_the_chat_request_line() -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Add 1 "}, {"type": "text", "text": "and 2"}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me add."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"},
                {"type": "text", "text": "Thanks."},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {"a": 3, "b": 3}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "6"}],
                    "is_error": False,
                }
            ],
        },
    ]
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    line = _line(
        _messages(
            system=system,
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            stop_sequences=["\n\n"],
            temperature=0.5,
            top_p=0.9,
            top_k=20,
            metadata={"user_id": "u"},
            max_tokens=64,
        )
    )
    assert line["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 1 and 2"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "3"},
        {"role": "user", "content": "Thanks."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 3, "b": 3}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_2", "content": "6"},
    ]
    function = {"name": "add", "parameters": ADD, "description": "Adds two integers"}
    assert line["tools"] == [{"type": "function", "function": function}]
    assert (line["tool_choice"], line["parallel_tool_calls"]) == ("required", False)
    expected = {"stop": ["\n\n"], "temperature": 0.5, "top_p": 0.9, "top_k": 20, "max_tokens": 64}
    assert {k: line[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("choice", "normalized"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "add"}, {"name": "add"}),
    ],
)
def test_tool_choices_map_to_the_openai_ones(choice: Any, normalized: Any) -> None:
    assert _line(_messages(tools=TOOLS, tool_choice=choice))["tool_choice"] == normalized


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"max_tokens": None}, "max_tokens", "required"),
        ({"max_tokens": 0}, "max_tokens", ""),
        ({"messages": []}, "messages", ""),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", ""),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
            "images",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
            "documents",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}
                ]
            },
            "messages[0].content[0].type",
            "",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].content[0].type",
            "images",
        ),
        ({"system": [{"type": "image"}]}, "system[0].type", "images"),
        ({"tools": [{"name": "add"}]}, "tools[0].input_schema", ""),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0].type",
            "client tools",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "needs 'tools'"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "mul"}},
            "tool_choice",
            "'mul'",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "sometimes"}}, "tool_choice", ""),
        ({"temperature": 1.5}, "temperature", ""),
        ({"stop_sequences": ""}, "stop_sequences", ""),
        ({"stream": 1}, "stream", ""),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(ApiError) as caught:
        _messages(**fields)
    assert (caught.value.status, caught.value.param) == (400, param), caught.value.message
    assert words in caught.value.message
    assert error_body(caught.value) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": caught.value.message},
    }


def test_output_config_format_is_the_response_format() -> None:
    fmt = {"format": {"type": "json_schema", "schema": ADD}, "effort": "low"}
    line = _line(_messages(output_config=fmt))
    assert line["response_format"] == {"type": "json_schema", "schema": ADD}
    assert "response_format" not in _line(_messages(output_config={"effort": "high"}))
    for bad in ({"format": {"type": "xml"}}, {"format": {"type": "json_schema"}}, "json"):
        with pytest.raises(ApiError) as caught:
            _messages(output_config=bad)
        assert caught.value.param in ("output_config", "output_config.format")


def test_count_tokens_needs_no_max_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS}
    line = _line(parse_count_tokens(json.dumps(body).encode()))
    assert line["count_only"] is True and line["tools"][0]["function"]["name"] == "add"


def test_error_types_follow_the_status() -> None:
    kinds = {
        status: error_body(ApiError(status, "m"))["error"]["type"]
        for status in (401, 404, 405, 413, 429, 500, 503)
    }
    assert kinds == {
        401: "authentication_error",
        404: "not_found_error",
        405: "invalid_request_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        503: "overloaded_error",
    }


# --- rank 0's events → Anthropic's message and stream -------------------------------------------


def _events(frames: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in frames:
        head, data = frame.decode().rstrip("\n").split("\n")
        name = head.removeprefix("event: ")
        body = json.loads(data.removeprefix("data: "))
        assert body["type"] == name
        out.append((name, body))
    return out


def _run(answer: AnthropicAnswer, events: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    frames = answer.opening()
    for event in events:
        frames += answer.feed(event)
    assert answer.finished
    return _events(frames + answer.closing())


def test_text_then_tool_use_stream_in_anthropics_order() -> None:
    answer = AnthropicAnswer(_messages(tools=TOOLS, stream=True), "msg_1", "m")
    events = _run(
        answer,
        [
            {"event": "begin", "prompt_tokens": 10, "cached_tokens": 4},
            {"event": "delta", "text": "Sure"},
            {"event": "delta", "text": ""},
            {"event": "delta", "text": "."},
            {
                "event": "tool_call",
                "call": {"id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
            },
            {
                "event": "done",
                "finish_reason": "tool_calls",
                "prompt_tokens": 10,
                "cached_tokens": 4,
                "completion_tokens": 7,
            },
        ],
    )
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert (start["id"], start["content"], start["stop_reason"]) == ("msg_1", [], None)
    assert start["usage"]["input_tokens"] == 6 and start["usage"]["cache_read_input_tokens"] == 4
    assert events[6][1] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "call_1", "name": "add", "input": {}},
    }
    assert events[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a": 1, "b": 2}'}
    assert events[9][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[9][1]["usage"]["output_tokens"] == 7
    body = answer.body()
    assert body["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 1, "b": 2}},
    ]
    assert (body["stop_reason"], body["usage"]["input_tokens"], body["usage"]["output_tokens"]) == (
        "tool_use",
        6,
        7,
    )


@pytest.mark.parametrize(
    ("done", "reason", "sequence"),
    [
        ({"finish_reason": "stop"}, "end_turn", None),
        ({"finish_reason": "length"}, "max_tokens", None),
        ({"finish_reason": "stop", "stop_sequence": "\n\n"}, "stop_sequence", "\n\n"),
    ],
)
def test_stop_reasons(done: dict[str, Any], reason: str, sequence: str | None) -> None:
    answer = AnthropicAnswer(_messages(), "msg_2", "m")
    events = _run(answer, [{"event": "begin", "prompt_tokens": 3}, {"event": "done", **done}])
    # Nothing generated: still one (empty) text block, streamed and not.
    assert [name for name, _ in events][2:4] == ["content_block_start", "content_block_stop"]
    assert answer.body()["content"] == [{"type": "text", "text": ""}]
    assert (answer.body()["stop_reason"], answer.body()["stop_sequence"]) == (reason, sequence)


def test_count_answer_is_the_prompt_length() -> None:
    answer = CountAnswer(_messages(), "msg_3", "m")
    answer.feed(
        {"event": "done", "finish_reason": "count", "prompt_tokens": 42, "completion_tokens": 0}
    )
    assert answer.finished and answer.body() == {"input_tokens": 42}
