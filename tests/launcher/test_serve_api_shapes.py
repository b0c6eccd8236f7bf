"""The pure halves of `mlx-cluster serve`'s OpenAI API: request bodies checked into rank 0's
line (tools, tool_choice, response_format, logprobs, n, sampling controls; every bad field a
400 naming it), and rank 0's events shaped into OpenAI's bodies and stream chunks.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from api_cases import TOOLS, USER, WEATHER

from launcher.serve.openai_api import parse_chat, parse_completion
from launcher.serve.openai_bodies import OpenAIAnswer, completion_logprobs
from launcher.serve.request_api import ApiError, GenerateRequest
from launcher.serve.tickets import Tickets


def _chat(**fields: Any) -> GenerateRequest:
    return parse_chat(json.dumps({"messages": USER, **fields}).encode())


def _completion(**fields: Any) -> GenerateRequest:
    return parse_completion(json.dumps({"prompt": "Hello", **fields}).encode())


def _line(request: GenerateRequest) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(request.rank_line("id-1", seed=7))
    return line


def _refused(parse: Any, fields: dict[str, Any], param: str, words: str = "") -> None:
    with pytest.raises(ApiError) as caught:
        parse(**fields)
    assert caught.value.status == 400
    assert caught.value.param == param, caught.value.message
    assert words in caught.value.message


# --- requests → rank 0's line -------------------------------------------------------------------


def test_plain_request_line_is_unchanged() -> None:
    """No new option used: rank 0 reads exactly the keys it always has (and, when max_tokens is
    not given, that it may shrink to fit the context)."""
    assert _line(_chat())["max_tokens_default"] is True
    assert set(_line(_chat(max_tokens=9))) == {
        "id",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "messages",
        "prompt",
        "prompt_ids",
    }
    assert set(
        _line(_completion(response_format={"type": "text"}, logit_bias={}, max_tokens=2))
    ) == set(_line(_chat(max_tokens=9)))


def test_tools_and_choices_reach_the_rank_normalized() -> None:
    line = _line(_chat(tools=TOOLS))
    assert line["tools"] == TOOLS and line["tool_choice"] == "auto"
    named = {"type": "function", "function": {"name": "add"}}
    line = _line(_chat(tools=TOOLS, tool_choice=named, parallel_tool_calls=False))
    assert (line["tool_choice"], line["parallel_tool_calls"]) == ({"name": "add"}, False)
    for choice in ("none", "required"):
        assert _line(_chat(tools=TOOLS, tool_choice=choice))["tool_choice"] == choice
    assert "tools" not in _line(_chat(tools=[], tool_choice="none"))


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "'required'"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "'nope'",
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type", "function"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name", "twice"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
            "tools[0].function.parameters",
            "",
        ),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", ""),
        ({"functions": [{"name": "f"}]}, "functions", "not supported"),
    ],
)
def test_bad_tools_are_400_naming_the_field(fields: dict[str, Any], param: str, words: str) -> None:
    _refused(_chat, fields, param, words)


def test_history_with_tool_calls_goes_to_the_template_form() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
    }
    odd = {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "not json"}}
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Add "}, {"type": "text", "text": "1 and 2"}],
        },
        {"role": "assistant", "content": None, "tool_calls": [call, odd]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "3"}]},
        {"role": "assistant", "content": None},
    ]
    line = _line(parse_chat(json.dumps({"messages": messages}).encode()))
    assert line["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 1 and 2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "add", "arguments": "not json"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "assistant", "content": ""},
    ]


@pytest.mark.parametrize(
    ("message", "param", "words"),
    [
        (
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                ],
            },
            "messages[0].content[1].type",
            "images",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
            },
            "messages[0].content[0].type",
            "audio",
        ),
        (
            {"role": "user", "content": [{"type": "file", "file": {}}]},
            "messages[0].content[0].type",
            "files",
        ),
        ({"role": "user", "content": [{"type": "text"}]}, "messages", "string 'text'"),
        (
            {"role": "assistant", "content": "x", "audio": {"id": "a"}},
            "messages[0].audio",
            "text only",
        ),
        ({"role": "tool", "content": "3"}, "messages[0].tool_call_id", ""),
        ({"role": "assistant", "tool_calls": []}, "messages[0].tool_calls", "non-empty"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            "messages[0].tool_calls[0].id",
            "",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}],
            },
            "messages[0].tool_calls[0].function",
            "string of JSON",
        ),
    ],
)
def test_bad_messages_are_400_naming_the_field(
    message: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat(json.dumps({"messages": [message]}).encode())
    assert (caught.value.status, caught.value.param) == (400, param), caught.value.message
    assert words in caught.value.message


def test_response_formats_are_normalized() -> None:
    assert "response_format" not in _line(_chat(response_format={"type": "text"}))
    line = _line(_chat(response_format={"type": "json_object"}))
    assert line["response_format"] == {"type": "json_object"}
    spec = {"name": "weather", "schema": WEATHER, "strict": True}
    line = _line(_chat(response_format={"type": "json_schema", "json_schema": spec}))
    assert line["response_format"] == {"type": "json_schema", "schema": WEATHER}
    line = _line(_completion(response_format={"type": "json_object"}))
    assert line["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ({"type": "xml"}, "response_format"),
        ("json", "response_format"),
        ({"type": "json_schema"}, "response_format.json_schema.schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}},
            "response_format.json_schema.strict",
        ),
    ],
)
def test_bad_response_formats_are_400(fmt: Any, param: str) -> None:
    _refused(_chat, {"response_format": fmt}, param)


def test_logprobs_and_sampling_controls_reach_the_rank() -> None:
    line = _line(
        _chat(
            logprobs=True,
            top_logprobs=5,
            top_k=40,
            min_p=0.05,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.1,
            logit_bias={"42": 100, "007": -100},
            seed=3,
            n=3,
            max_tokens=99,
            max_completion_tokens=12,
        )
    )
    expected = {"logprobs": 5, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5}
    expected |= {"frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 3, "n": 3}
    expected |= {"logit_bias": {"42": 100.0, "7": -100.0}, "max_tokens": 12}
    assert {k: line[k] for k in expected} == expected
    assert _line(_chat(logprobs=True))["logprobs"] == 0
    assert "logprobs" not in _line(_chat(logprobs=False))
    assert _line(_completion(logprobs=3))["logprobs"] == 3
    assert _line(_completion(logprobs=0))["logprobs"] == 0
    assert "repetition_penalty" not in _line(_chat(repetition_penalty=1))  # 1 changes nothing


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": 2}, "logprobs"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"a": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"n": 9}, "n"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0, "max_completion_tokens": 5}, "max_tokens"),
        ({"max_completion_tokens": "5"}, "max_completion_tokens"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ],
)
def test_bad_chat_options_are_400(fields: dict[str, Any], param: str) -> None:
    _refused(_chat, fields, param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"n": 2}, "n"),
        ({"tools": TOOLS}, "tools"),
        ({"echo": True}, "echo"),
        ({"best_of": 2}, "best_of"),
    ],
)
def test_bad_completion_options_are_400(fields: dict[str, Any], param: str) -> None:
    _refused(_completion, fields, param)


# --- rank 0's events → OpenAI bodies ------------------------------------------------------------


def _entry(token: str, logprob: float, top: list[tuple[str, float]]) -> dict[str, Any]:
    alternatives = [{"token": t, "logprob": p, "bytes": list(t.encode())} for t, p in top]
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": alternatives,
    }


def _sse(frames: list[bytes]) -> list[Any]:
    out = []
    for frame in frames:
        assert frame.startswith(b"data: ") and frame.endswith(b"\n\n"), frame
        data = frame[len(b"data: ") : -2]
        out.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return out


def _feed(answer: OpenAIAnswer, events: list[dict[str, Any]]) -> list[Any]:
    frames = answer.opening()
    for event in events:
        frames += answer.feed(event)
    assert answer.finished
    return _sse(frames + answer.closing())


def test_n_choices_count_the_prompt_once() -> None:
    request = _chat(n=2, stream=True, stream_options={"include_usage": True})
    answer = OpenAIAnswer(request, "chatcmpl-1", "m")
    done = {"event": "done", "finish_reason": "length", "prompt_tokens": 5, "cached_tokens": 2}
    chunks = _feed(
        answer,
        [
            {"event": "begin", "index": 0, "prompt_tokens": 5},
            {"event": "begin", "index": 1, "prompt_tokens": 5},
            {"event": "delta", "index": 1, "text": "b"},
            {"event": "delta", "text": "a"},
            {**done, "index": 1, "completion_tokens": 1, "finish_reason": "stop"},
            {**done, "completion_tokens": 4},
        ],
    )
    assert [c["delta"] for c in chunks[0]["choices"]] == [{"role": "assistant", "content": ""}] * 2
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks[1:3]] == [
        (1, {"content": "b"}),
        (0, {"content": "a"}),
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[3:5]] == ["stop", "length"]
    assert chunks[5]["choices"] == [] and chunks[6] == "[DONE]"
    usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    assert usage.items() <= chunks[5]["usage"].items()
    body = answer.body()
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "a", "length"),
        (1, "b", "stop"),
    ]
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}


def test_tool_calls_stream_as_deltas_and_end_the_message() -> None:
    answer = OpenAIAnswer(_chat(tools=TOOLS, stream=True), "chatcmpl-2", "m")
    calls = [
        {"id": "call_a", "name": "add", "arguments": '{"a": 1, "b": 2}'},
        {
            "id": "call_b",
            "name": "get_weather",
            "arguments": '{"city": "Paris", "unit": "celsius"}',
        },
    ]
    chunks = _feed(
        answer,
        [
            {"event": "begin", "prompt_tokens": 9},
            *({"event": "tool_call", "call": c} for c in calls),
            {
                "event": "done",
                "finish_reason": "tool_calls",
                "prompt_tokens": 9,
                "completion_tokens": 30,
            },
        ],
    )
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:3]]
    assert [(d["index"], d["id"], d["function"]["name"]) for d in deltas] == [
        (0, "call_a", "add"),
        (1, "call_b", "get_weather"),
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls" and chunks[4] == "[DONE]"
    message = answer.body()["choices"][0]["message"]
    assert message["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        {"a": 1, "b": 2},
        {"city": "Paris", "unit": "celsius"},
    ]


def test_logprobs_take_openais_shapes() -> None:
    entries = [
        _entry("Hel", -0.5, [("Hel", -0.5), ("He", -1.5)]),
        _entry("lo", -0.1, [("lo", -0.1), ("l", -3.0)]),
    ]
    events = [
        {"event": "begin", "prompt_tokens": 2},
        {"event": "delta", "text": "", "logprobs": entries[:1]},  # a token with no text yet
        {"event": "delta", "text": "Hello", "logprobs": entries[1:]},
        {"event": "done", "finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 2},
    ]
    chat = OpenAIAnswer(_chat(logprobs=True, top_logprobs=2), "c", "m")
    for event in events:
        chat.feed(event)
    assert chat.body()["choices"][0]["logprobs"] == {"content": entries, "refusal": None}
    completion = OpenAIAnswer(_completion(logprobs=1, stream=True), "c", "m")
    chunks = _feed(completion, events)
    assert chunks[0]["choices"][0]["logprobs"]["text_offset"] == [0]
    assert chunks[1]["choices"][0]["logprobs"]["text_offset"] == [3]
    assert completion.body()["choices"][0]["logprobs"] == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{"Hel": -0.5, "He": -1.5}, {"lo": -0.1, "l": -3.0}],
        "text_offset": [0, 3],
    }
    alike = _entry("\ufffd", -0.1, [("\ufffd", -0.1), ("\ufffd", -2.5), ("a", -3.0)])
    assert completion_logprobs([alike], 0)["top_logprobs"] == [{"\ufffd": -0.1, "a": -3.0}]
    plain = OpenAIAnswer(_completion(), "c", "m")
    for event in events:
        plain.feed(event)
    assert plain.body()["choices"][0]["logprobs"] is None


def test_a_ticket_of_n_choices_ends_with_the_nth_done() -> None:
    async def main() -> list[str]:
        tickets = Tickets(4)
        ticket = tickets.open("r", asyncio.get_running_loop(), choices=2)
        for index in (1, 0):
            tickets.route({"event": "done", "id": "r", "index": index})
            assert ("r" in tickets) == (index == 1)  # open until both choices are done
        tickets.route({"event": "tool_call", "id": "r"})  # ended: no longer routed
        return [(await tickets.next_event(ticket, 1.0))["event"] for _ in range(2)]

    assert asyncio.run(main()) == ["done", "done"]
