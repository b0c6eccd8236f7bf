"""Tool calls read out of generated text (cluster/serve/tool_stream.py, output.py): markers split
across pieces, text around calls, several calls, a call's arguments given out as they grow, and a
call cut by max_tokens that stays a call — through ChoiceOutput with a real tokenizer, token by
token as the batch hands them over."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.utils import load_tokenizer

from cluster.serve.control import Sampling
from cluster.serve.output import ChoiceOutput
from cluster.serve.requests import Request
from cluster.serve.tool_stream import CallBody, ToolCallText, call_head

CALL = '{"name": "f", "arguments": {"x": 1}}'
TEXT = f"Sure.<tool_call>\n{CALL}\n</tool_call>\n<tool_call>{CALL}</tool_call> done"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'


def feed_all(pieces: list[str]) -> tuple[str, list[str]]:
    """(plain text, each call's body) from the parts ToolCallText gives out."""
    t = ToolCallText("<tool_call>", "</tool_call>")
    plain, calls, open_call = "", [], ""
    for kind, s in [p for piece in pieces for p in t.feed(piece)] + t.flush():
        if kind == "text":
            plain += s
        elif kind == "call":
            open_call += s
        else:
            calls.append(open_call)
            open_call = ""
    return plain, calls + ([open_call] if open_call else [])


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(TEXT)])
def test_calls_come_out_whole_however_the_text_is_cut(size: int) -> None:
    plain, calls = feed_all([TEXT[i : i + size] for i in range(0, len(TEXT), size)])
    assert plain == "Sure. done"  # the "\n" between the calls is no text
    assert [c.strip() for c in calls] == [CALL, CALL]


@pytest.mark.parametrize("size", [1, 2, len(TEXT)])
def test_whitespace_after_calls_is_dropped_and_text_keeps_its_own(size: int) -> None:
    text = f"<tool_call>{CALL}</tool_call>\n\n<tool_call>{CALL}</tool_call> \n"
    assert feed_all([text[i : i + size] for i in range(0, len(text), size)])[0] == ""
    text = f"<tool_call>{CALL}</tool_call>\n \nDone."
    assert feed_all([text[i : i + size] for i in range(0, len(text), size)])[0] == "\n \nDone."


def test_text_that_only_looks_like_a_marker_is_text() -> None:
    assert feed_all(["a <tool", "_cal", "x> b"]) == ("a <tool_calx> b", [])


def test_a_calls_body_comes_out_before_its_end_marker() -> None:
    t = ToolCallText("<tool_call>", "</tool_call>")
    assert t.feed('hi <tool_call>{"name"') == [("text", "hi "), ("call", '{"name"')]
    assert t.feed(": 1}</tool") == [("call", ": 1}")]  # "</tool" may be the end marker
    assert t.open and t.flush() == [("call", "</tool")]


def test_the_head_of_a_json_call() -> None:
    assert call_head('{"na').state == "more"
    cut = call_head('{"name": "get_w')
    assert (cut.state, cut.name, cut.named) == ("more", "get_w", False)
    head = call_head('{ "name" : "f" ,\n "arguments": {"x"')
    assert (head.state, head.name, head.named) == ("args", "f", True)
    assert call_head('{"arguments": {}, "name": "f"}').state == "no"  # another order: parsed whole
    assert call_head("get_weather(city='Paris')").state == "no"


@pytest.mark.parametrize("size", [1, 3, 11])
def test_arguments_stream_as_they_grow_and_stop_at_their_end(size: int) -> None:
    body, announced, arguments = CallBody(True, ("get_weather",), False), [], ""
    text = WEATHER_CALL + "  "
    for i in range(0, len(text), size):
        name, more = body.feed(text[i : i + size])
        announced += [name] if name else []
        arguments += more
    assert announced == ["get_weather"]
    assert arguments == '{"city": "Paris", "unit": "celsius"}'


def test_a_cut_forced_call_is_named_once_one_tool_fits() -> None:
    names = ("get_weather", "get_time")
    assert CallBody(True, names, True).cut() is None
    for prefix, settled in [('{"name": "get_', None), ('{"name": "get_w', ("get_weather", ""))]:
        body = CallBody(True, names, True)
        body.feed(prefix)
        assert body.cut() == settled
    single = CallBody(True, ("get_weather",), True)
    single.feed('{"na')
    assert single.cut() == ("get_weather", "")
    parsed = CallBody(True, names, False)  # auto mode: only a whole name that is a tool's
    parsed.feed('{"name": "get_w')
    assert parsed.cut() is None
    parsed.feed('eather", "arguments": {"ci')
    assert parsed.cut() == ("get_weather", '{"ci')


# ChoiceOutput with the tiny model's tokenizer: its template has hermes-style <tool_call>
# markers and mlx-lm parses them with json_tools.


@pytest.fixture(scope="module")
def tokenizer(tiny: Callable[[str], Path]) -> Any:
    wrapped = load_tokenizer(tiny("qwen2"))
    assert wrapped.tool_call_start == "<tool_call>" and wrapped.has_tool_calling
    return wrapped


def run(tokenizer: Any, text: str, finish: str, mode: str, **fields: Any) -> list[dict[str, Any]]:
    """Feeds `text`'s tokens one at a time; the events the choice emits."""
    events: list[dict[str, Any]] = []
    request = Request("r", [1], 100, Sampling(), tools=TOOLS, tool_mode=mode, **fields)
    out = ChoiceOutput(request, 0, 0, tokenizer, lambda e, **f: events.append({"event": e, **f}))
    ids = tokenizer.encode(text, add_special_tokens=False)
    if finish == "stop":  # the batch's last step carries the end-of-turn token
        ids.append(tokenizer.eos_token_id)
    vocab = mx.zeros((len(tokenizer.vocab),))
    for k, token in enumerate(ids):
        out.token(token, finish if k == len(ids) - 1 else None, vocab)
    return events


def shaped(events: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str]], str, int]:
    """(text, [(name, arguments)], finish_reason, tool_call events)."""
    text = "".join(e["text"] for e in events if e["event"] == "delta")
    calls: list[tuple[str, str]] = []
    for e in events:
        if e["event"] == "tool_call" and "call" in e:
            calls.append((e["call"]["name"], e["call"]["arguments"]))
        elif e["event"] == "tool_call":
            calls[-1] = (calls[-1][0], calls[-1][1] + e["arguments"])
    done = [e for e in events if e["event"] == "done"]
    assert len(done) == 1
    return text, calls, done[0]["finish_reason"], sum(e["event"] == "tool_call" for e in events)


def test_a_parsed_call_streams_its_arguments(tokenizer: Any) -> None:
    text = f"Let me look.<tool_call>\n{WEATHER_CALL}\n</tool_call>"
    said, calls, finish, events = shaped(run(tokenizer, text, "stop", "auto"))
    assert said == "Let me look." and finish == "tool_calls"
    assert calls == [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
    assert events > 3  # the start, then the arguments in pieces as their tokens came
    assert json.loads(calls[0][1]) == {"city": "Paris", "unit": "celsius"}


def test_a_parsed_call_cut_by_max_tokens_stays_a_call(tokenizer: Any) -> None:
    cut = f"Let me look.<tool_call>\n{WEATHER_CALL[:50]}"
    said, calls, finish, _ = shaped(run(tokenizer, cut, "length", "auto"))
    assert said == "Let me look." and finish == "length"
    assert calls == [("get_weather", WEATHER_CALL[37:50])]  # what its arguments had so far
    assert "<tool_call>" not in said and "get_weather" not in said


def test_a_call_cut_inside_its_name_is_not_text(tokenizer: Any) -> None:
    said, calls, finish, _ = shaped(
        run(tokenizer, 'Ok<tool_call>\n{"name": "get_we', "length", "auto")
    )
    assert (said, calls, finish) == ("Ok", [], "length")


def test_text_in_a_call_that_is_no_call_stays_text(tokenizer: Any) -> None:
    said, calls, _, _ = shaped(run(tokenizer, "a <tool_call> b </tool_call> c", "stop", "auto"))
    assert calls == [] and said == "a  b  c"
    said, calls, _, _ = shaped(run(tokenizer, "a <tool_call> ramble", "length", "auto"))
    assert calls == [] and said == "a <tool_call> ramble"


def test_a_forced_call_cut_before_its_marker_is_the_named_tool(tokenizer: Any) -> None:
    named = run(tokenizer, "<tool", "length", "forced", forced_names=("get_weather",))
    assert shaped(named)[:3] == ("", [("get_weather", "")], "length")
    either = run(tokenizer, "<tool", "length", "forced", forced_names=("get_weather", "get_time"))
    assert shaped(either)[:3] == ("", [], "length")


def test_a_whole_call_cut_only_before_its_end_marker_is_whole(tokenizer: Any) -> None:
    said, calls, finish, _ = shaped(
        run(tokenizer, f"<tool_call>\n{WEATHER_CALL}\n", "length", "auto")
    )
    assert said == "" and finish == "length"
    assert calls == [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
