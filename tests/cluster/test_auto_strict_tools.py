"""tool_choice "auto" with a strict tool (OpenAI's strict mode): the model may answer in text, and
any call it starts is held to the tool's closed schema. Rank 0's request parsing and the grammar
processor every rank runs, on the tiny model's tokenizer (its calls: <tool_call> JSON markers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_tokenizer

from cluster.serve.constraints import GrammarProcessor
from cluster.serve.requests import Limits, Request, parse_line
from cluster.tiny_model import write_tiny_model

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["city", "unit"],
    "additionalProperties": False,  # as the launcher closes a strict schema
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TokenizerWrapper:
    folder: Path = write_tiny_model(tmp_path_factory.mktemp("auto") / "m", layers=1, hidden=32)
    wrapper = load_tokenizer(folder)
    assert wrapper.has_tool_calling and wrapper.tool_call_start == "<tool_call>"
    return wrapper


def _request(tokenizer: TokenizerWrapper, **fields: Any) -> Request:
    raw = {"id": "r", "messages": [{"role": "user", "content": "Weather in Paris?"}],
           "max_tokens": 40, "temperature": 0.0, "top_p": 1.0, "seed": 1, "tools": TOOLS,
           **fields}  # fmt: skip
    parsed = parse_line(json.dumps(raw), tokenizer, Limits(vocab=tokenizer.vocab_size))
    assert isinstance(parsed, Request)
    return parsed


def _allowed_after(tokenizer: TokenizerWrapper, grammar: str, text: str) -> list[str]:
    """The single characters the grammar allows right after `text` (fed token by token)."""
    processor = GrammarProcessor(grammar, tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    vocab = tokenizer.vocab_size
    for i in range(len(ids) + 1):  # the processor's calls: one per step, the fed token last
        mask = processor(mx.array(ids[: max(1, i)]), mx.zeros((1, vocab)))
    allowed = [t for t in range(vocab) if mask[0, t].item() == 0]
    return sorted({tokenizer.decode([t]) for t in allowed if len(tokenizer.decode([t])) == 1})


def test_auto_without_a_strict_tool_is_not_constrained(tokenizer: TokenizerWrapper) -> None:
    request = _request(tokenizer)
    assert request.tool_mode == "auto" and request.sampling.grammar is None


def test_auto_with_a_strict_tool_allows_text_and_holds_a_call_to_the_schema(
    tokenizer: TokenizerWrapper,
) -> None:
    request = _request(tokenizer, strict_tools=["get_weather"])
    grammar = request.sampling.grammar
    assert request.tool_mode == "auto" and grammar is not None
    # Free text: any character goes, the call's marker included.
    assert {"H", "<", "{", "x"} <= set(_allowed_after(tokenizer, grammar, "Hello"))
    # Inside a call: the name is the tool's, and every property is required before it closes.
    assert _allowed_after(tokenizer, grammar, 'Sure <tool_call>\n{"name": "') == ["g"]
    call = 'Sure <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"'
    assert _allowed_after(tokenizer, grammar, call) == [","]  # no "}" before "unit"
    assert _allowed_after(tokenizer, grammar, call + ', "') == ["u"]  # no property of its own


def test_with_response_format_the_answer_is_that_json_or_the_calls(
    tokenizer: TokenizerWrapper,
) -> None:
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "schema": answer}
    both = _request(tokenizer, strict_tools=["get_weather"], response_format=fmt)
    assert both.sampling.grammar is not None
    assert _allowed_after(tokenizer, both.sampling.grammar, "") == ["<", "{"]
    assert _allowed_after(tokenizer, both.sampling.grammar, '{"') == ["o"]
    one = _request(tokenizer, strict_tools=["get_weather"], parallel_tool_calls=False)
    assert one.sampling.grammar not in (None, both.sampling.grammar)
