"""The OpenAI API of `mlx-cluster serve` for agents and editors, end to end: the real server
(`--local 2`, tiny model) driven by the official `openai` client. Tool calls and JSON forced by
constrained decoding validate against their schemas, logprobs equal one process's log-softmax,
seeded choices reproduce alone and in a batch. (The pure halves: test_serve_api_shapes.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from api_cases import TOOLS, USER, WEATHER, keyed_server
from launch_helpers import tiny_model
from serve_helpers import Server, _loaded

__all__ = ["tiny_model"]  # the fixture

KEY = "api-key"


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    yield from keyed_server(tiny_model, KEY)


def _schema_of(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = next(
        t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name
    )
    return schema


def _check_calls(calls: list[Any], names: set[str]) -> None:
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), _schema_of(call.function.name))


def _streamed_calls(chunks: list[Any]) -> tuple[list[Any], str | None]:
    """Assemble `delta.tool_calls` by index, as OpenAI's streaming docs describe."""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += part.id or ""
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
    shaped = [
        openai.types.chat.ChatCompletionMessageToolCall(
            id=c["id"], type="function", function={"name": c["name"], "arguments": c["arguments"]}
        )
        for _, c in sorted(calls.items())
    ]
    return shaped, finish


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
        ("required", {"get_weather", "add"}),
    ],
)
def test_forced_tool_calls_validate_against_their_schemas(
    server: Server, choice: Any, names: set[str]
) -> None:
    client = server.client(KEY)
    fields: Any = {"model": "m", "messages": USER, "tools": TOOLS, "tool_choice": choice}
    fields |= {"max_tokens": 300, "temperature": 0, "parallel_tool_calls": False}
    out = client.chat.completions.create(**fields)
    assert out.choices[0].finish_reason == "tool_calls", out
    _check_calls(out.choices[0].message.tool_calls or [], names)
    assert len(out.choices[0].message.tool_calls or []) == 1  # parallel_tool_calls: false
    calls, finish = _streamed_calls(list(client.chat.completions.create(**fields, stream=True)))
    assert finish == "tool_calls"
    _check_calls(calls, names)
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in out.choices[0].message.tool_calls or []
    ]


def test_a_forced_call_cut_by_max_tokens_stays_a_call(server: Server) -> None:
    """The tiny model writes its calls between <tool_call> markers; cut inside the arguments,
    the answer is still the named call with the arguments so far, streamed as they grow."""
    client = server.client(KEY)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    fields: Any = {"model": "m", "messages": USER, "tools": TOOLS, "tool_choice": choice}
    fields |= {"temperature": 0, "parallel_tool_calls": False}
    whole = client.chat.completions.create(**fields, max_tokens=300)
    assert whole.usage is not None and whole.choices[0].message.tool_calls
    arguments = whole.choices[0].message.tool_calls[0].function.arguments
    for cut in range(whole.usage.completion_tokens - 1, 0, -1):  # the last token inside them
        out = client.chat.completions.create(**fields, max_tokens=cut).choices[0]
        assert out.finish_reason == "length" and out.message.content is None, out
        (call,) = out.message.tool_calls or []
        assert call.function.name == "get_weather"
        if call.function.arguments != arguments:
            break
    assert 0 < len(call.function.arguments) < len(arguments)
    assert arguments.startswith(call.function.arguments)
    chunks = list(client.chat.completions.create(**fields, max_tokens=cut, stream=True))
    parts = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert len(parts) > 2 and parts[0].function.name == "get_weather"
    calls, finish = _streamed_calls(chunks)
    assert finish == "length" and [c.function.arguments for c in calls] == [call.function.arguments]
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


def test_tool_call_round_trip_goes_through_the_template(server: Server, tiny_model: Path) -> None:

    arguments = '{"city": "Paris", "unit": "celsius"}'
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    messages: Any = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]
    out = server.client(KEY).chat.completions.create(
        model="m", messages=messages, tools=TOOLS, max_tokens=5, temperature=0
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert isinstance(out.choices[0].message.content, str)
    # The prompt rank 0 read is exactly the template's rendering of the history and the tools.
    _, tokenizer = _loaded(str(tiny_model))
    template_form = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {**call, "function": {"name": "get_weather", "arguments": json.loads(arguments)}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]
    ids = tokenizer.apply_chat_template(template_form, tools=TOOLS, add_generation_prompt=True)
    assert "<tool_response>" in tokenizer.decode(ids)
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)


def test_agent_loop_sends_the_reply_back(server: Server) -> None:
    """As agents do: the reply's message object itself goes back into the history."""
    client = server.client(KEY)
    messages: Any = [*USER]
    reply = client.chat.completions.create(
        model="m",
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,  # a random model would go on calling until max_tokens
        max_tokens=300,
    ).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.tool_calls
    messages.append(reply.message)
    for call in reply.message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "done"})
    final = client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=5
    )
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


SCHEMAS: list[dict[str, Any]] = [
    WEATHER,
    {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 10},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["name", "age"],
                "additionalProperties": False,
            },
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "b", "c"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["person", "tags", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"x": {"type": "number", "minimum": -5, "maximum": 5}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "minItems": 2,
        "maxItems": 2,
    },
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["enum", "nested", "array"])
def test_json_schema_output_validates(server: Server, schema: dict[str, Any]) -> None:
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    client = server.client(KEY)
    out = client.chat.completions.create(
        model="m", messages=USER, response_format=fmt, max_tokens=300, temperature=0
    )
    assert out.choices[0].finish_reason == "stop", out
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)
    streamed = client.chat.completions.create(
        model="m", messages=USER, response_format=fmt, max_tokens=300, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == out.choices[0].message.content


def test_json_object_is_an_object(server: Server, tiny_model: Path) -> None:
    _, tokenizer = _loaded(str(tiny_model))
    # Random weights ramble inside a string for ever: a bias on '"' and '}' lets the object
    # end within max_tokens; the grammar alone makes it valid JSON.
    closing = [tokenizer.encode(c, add_special_tokens=False)[-1] for c in ('"', "}")]
    out = server.client(KEY).chat.completions.create(
        model="m",
        messages=USER,
        response_format={"type": "json_object"},
        max_tokens=300,
        temperature=0,
        logit_bias={str(t): 10 for t in closing},
    )
    assert out.choices[0].finish_reason == "stop", out
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_auto_mode_holds_a_strict_tools_call_to_its_schema(
    server: Server, tiny_model: Path
) -> None:
    """tool_choice auto, a strict tool and response_format: the answer is that JSON or a call.
    A bias on '<' makes the random model start the call; from there the grammar writes the
    tool's name and holds the arguments to the closed schema (city ≤ 12 characters, unit an
    enum), so the call ends and validates, and nothing of it comes back as content."""
    _, tokenizer = _loaded(str(tiny_model))
    lt = tokenizer.encode("<", add_special_tokens=False)[-1]
    weather = {**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}
    fields: Any = {"model": "m", "messages": USER, "tools": [weather], "tool_choice": "auto"}
    fields |= {"response_format": {"type": "json_object"}, "parallel_tool_calls": False}
    fields |= {"max_tokens": 200, "temperature": 0, "logit_bias": {str(lt): 100}}
    client = server.client(KEY)
    out = client.chat.completions.create(**fields)
    assert out.choices[0].finish_reason == "tool_calls", out
    assert not out.choices[0].message.content
    _check_calls(out.choices[0].message.tool_calls or [], {"get_weather"})
    calls, finish = _streamed_calls(list(client.chat.completions.create(**fields, stream=True)))
    assert finish == "tool_calls"
    assert [c.function.arguments for c in calls] == [
        c.function.arguments for c in out.choices[0].message.tool_calls or []
    ]


def test_unsupported_schema_feature_is_400_naming_it(server: Server) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as caught:
        server.client(KEY).chat.completions.create(
            model="m", messages=USER, response_format=fmt, max_tokens=5
        )
    assert "uniqueItems" in caught.value.message
    assert server.health()[0] == 200


def _reference_logprobs(
    tiny_model: Path, ids: list[int], steps: int
) -> list[tuple[int, list[tuple[int, float]]]]:
    """Greedy in this process: each step's chosen token and the log-softmax's top 5."""
    import mlx.core as mx

    model, _ = _loaded(str(tiny_model))
    out = []
    for _ in range(steps):
        logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
        logprobs = (logits - mx.logsumexp(logits)).tolist()
        top = sorted(range(len(logprobs)), key=lambda i: -logprobs[i])[:5]
        out.append((top[0], [(i, logprobs[i]) for i in top]))
        ids = [*ids, top[0]]
    return out


def test_top_logprobs_equal_one_process(server: Server, tiny_model: Path) -> None:
    _, tokenizer = _loaded(str(tiny_model))
    out = server.client(KEY).chat.completions.create(
        model="m", messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=5
    )
    content = (out.choices[0].logprobs and out.choices[0].logprobs.content) or []
    assert out.usage is not None and len(content) == out.usage.completion_tokens == 6
    prompt = tokenizer.apply_chat_template(USER, add_generation_prompt=True)
    reference = _reference_logprobs(tiny_model, list(prompt), 6)
    for entry, (chosen, top) in zip(content, reference, strict=True):
        assert entry.token == tokenizer.decode([chosen])
        assert entry.bytes == list(entry.token.encode())
        assert abs(entry.logprob - top[0][1]) < 1e-4
        alternatives = [a.logprob for a in entry.top_logprobs]
        assert len(alternatives) == 5 and alternatives == sorted(alternatives, reverse=True)
        assert all(abs(a - b) < 1e-4 for a, (_, b) in zip(alternatives, top, strict=True))


def test_completion_logprobs_shape(server: Server, tiny_model: Path) -> None:
    _, tokenizer = _loaded(str(tiny_model))
    client = server.client(KEY)
    out = client.completions.create(
        model="m", prompt="Hello world", max_tokens=6, temperature=0, logprobs=3
    )
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    reference = _reference_logprobs(tiny_model, tokenizer.encode("Hello world"), 6)
    for token, logprob, top, (chosen, ref) in zip(
        lp.tokens, lp.token_logprobs, lp.top_logprobs, reference, strict=True
    ):
        assert token == tokenizer.decode([chosen]) and abs(logprob - ref[0][1]) < 1e-4
        # 3 alternatives and the chosen token, fewer when partial UTF-8 decodes alike ('\ufffd')
        assert len(top) <= 4 and top[token] == logprob == max(top.values())
    streamed = client.completions.create(
        model="m", prompt="Hello world", max_tokens=6, temperature=0, logprobs=3, stream=True
    )
    tokens: list[str] = []
    offsets: list[int] = []
    for chunk in streamed:
        if chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens or []
            offsets += chunk.choices[0].logprobs.text_offset or []
    assert (tokens, offsets) == (lp.tokens, lp.text_offset)


def test_n_choices_with_a_seed_reproduce(server: Server) -> None:
    client = server.client(KEY)
    fields: Any = {"model": "m", "messages": USER, "max_tokens": 8, "temperature": 1.0, "seed": 5}
    first = client.chat.completions.create(**fields, n=3)
    again = client.chat.completions.create(**fields, n=3)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1, "three choices, one sequence"
    single = client.chat.completions.create(**fields)
    assert first.usage is not None and single.usage is not None
    assert first.usage.prompt_tokens == single.usage.prompt_tokens
    assert first.usage.completion_tokens == 24 == 3 * single.usage.completion_tokens
    chunks = list(client.chat.completions.create(**fields, n=3, stream=True))
    streamed = ["", "", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == texts


def test_concurrent_seeds_each_reproduce_their_solo_output(server: Server) -> None:
    client = server.client(KEY)

    def run(seed: int) -> str:
        out = client.chat.completions.create(
            model="m",
            messages=USER,
            max_tokens=24,
            temperature=0.9,
            seed=seed,
            extra_body={"top_k": 50, "min_p": 0.02},
        )
        return out.choices[0].message.content or ""

    solo = [run(1), run(2)]
    assert solo[0] != solo[1]
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(run, [1, 2])) == solo


def test_logit_bias_forces_a_token(server: Server, tiny_model: Path) -> None:

    _, tokenizer = _loaded(str(tiny_model))
    token = tokenizer.encode(" the", add_special_tokens=False)[-1]
    out = server.client(KEY).completions.create(
        model="m", prompt="Hello world", max_tokens=4, temperature=0, logit_bias={str(token): 100}
    )
    detokenizer = tokenizer.detokenizer  # as mlx-lm streams text (a first space is dropped)
    detokenizer.reset()
    for _ in range(4):
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert out.choices[0].text == detokenizer.text


@pytest.mark.parametrize(
    "settings",
    [
        # Negative penalties favour what the context holds: they change this model's argmax.
        {"presence_penalty": -1.0},
        {"frequency_penalty": -1.0},
        {"repetition_penalty": 1.8},
        {"logit_bias": {"FIRST": -100.0, "45": 4.0}, "presence_penalty": 0.7},
    ],
)
def test_penalties_and_bias_change_tokens_as_mlx_lms_processors_do(
    server: Server, tiny_model: Path, settings: dict[str, Any]
) -> None:
    """Greedy, so the processors alone decide: the served text equals mlx-lm's stream_generate
    with make_logits_processors and the same settings, and differs from no settings at all."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    model, tokenizer = _loaded(str(tiny_model))
    prompt = "Tell me about the sea and the mountains"

    def reference(**s: Any) -> tuple[str, list[int]]:
        bias = {int(k): v for k, v in (s.get("logit_bias") or {}).items()} or None
        processors = make_logits_processors(
            bias,
            s.get("repetition_penalty"),
            presence_penalty=s.get("presence_penalty"),
            frequency_penalty=s.get("frequency_penalty"),
        )
        ids = mx.array(tokenizer.encode(prompt))
        pieces = list(
            stream_generate(
                model, tokenizer, ids, max_tokens=24, sampler=make_sampler(0.0),
                logits_processors=processors,
            )
        )  # fmt: skip
        return "".join(r.text for r in pieces), [r.token for r in pieces]

    plain, tokens = reference()
    if "logit_bias" in settings:  # "FIRST": the token greedy picks first without any bias
        bias = settings["logit_bias"]
        settings = {**settings, "logit_bias": {str(tokens[0]): bias["FIRST"], "45": bias["45"]}}
    openai_fields = {k: v for k, v in settings.items() if k != "repetition_penalty"}
    extra = {k: v for k, v in settings.items() if k == "repetition_penalty"} or None
    out = server.client(KEY).completions.create(
        model="m", prompt=prompt, max_tokens=24, temperature=0, extra_body=extra, **openai_fields
    )
    expected, _ = reference(**settings)
    assert out.choices[0].text == expected
    assert expected != plain  # the settings matter for this prompt


def test_sampling_controls_are_taken(server: Server) -> None:
    out = server.client(KEY).chat.completions.create(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}],
            }
        ],
        max_completion_tokens=5,
        presence_penalty=1.5,
        frequency_penalty=-0.5,
        temperature=0.8,
        seed=3,
        stop=["\n\n", "xyz"],
        extra_body={"repetition_penalty": 1.3, "top_k": 10, "min_p": 0.1},
    )
    assert out.usage is not None and out.usage.completion_tokens <= 5
    assert out.choices[0].finish_reason in ("stop", "length")


def test_images_are_400_naming_the_field(server: Server) -> None:
    image: Any = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        server.client(KEY).chat.completions.create(model="m", messages=messages, max_tokens=3)
    body: Any = caught.value.body
    assert body["param"] == "messages[0].content[1].type" and "image" in body["message"]


def test_x_api_key_is_accepted_on_openai_routes(server: Server) -> None:
    status, body = server.request("GET", "/v1/models", headers={"x-api-key": KEY})
    assert status == 200 and body["object"] == "list"
    status, body = server.request("GET", "/v1/models", headers={"x-api-key": "wrong"})
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
