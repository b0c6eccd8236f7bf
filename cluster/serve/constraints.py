"""Constrained decoding with llguidance: JSON schemas, any JSON object, and tool calls.

llguidance (not xgrammar) because it needs nothing beyond numpy — xgrammar pulls in torch and
triton, over a gigabyte, for a CPU mask — and it compiles JSON schemas lazily, so a large
schema costs no start-up. Its MLX helper is a Metal kernel; the mask is applied here with plain
MLX ops so the same code runs on the CPU build.

Every rank computes the same mask at the same step from the same grammar and the same sampled
tokens: a mask costs tens of microseconds here, far less than sharing vocab/32 words from rank 0
in a collective every step (scripts/bench_serve.py measures both).
"""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
from mlx_lm.tokenizer_utils import TokenizerWrapper

if TYPE_CHECKING:  # a TypedDict of the stub only
    from llguidance._lib import JsonCompileOptions


class GrammarError(ValueError):
    """The schema or grammar cannot be used (the message names what)."""


@cache
def ll_tokenizer(tokenizer: TokenizerWrapper) -> llguidance.LLTokenizer:
    """llguidance's view of the vocabulary (about a second to build: once per process)."""
    eos = sorted(tokenizer.eos_token_ids)
    return llguidance.hf.from_tokenizer(tokenizer._tokenizer, eos_token=eos or None)


# Compact JSON: with free whitespace allowed, a weak model can spend its whole max_tokens on
# spaces and newlines between tokens (random weights do). Separators as json.dumps writes them.
JSON_STYLE: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


def json_grammar(schema: dict[str, Any] | None) -> str:
    """A grammar for output that is one JSON value of `schema` (None: any JSON object)."""
    return llguidance.LLMatcher.grammar_from_json_schema(
        schema or {"type": "object"}, overrides=JSON_STYLE
    )


def _call_schema(tools: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """{"name": <one of names>, "arguments": <that tool's parameters>} as one JSON schema."""
    by_name = {t["function"]["name"]: t["function"] for t in tools if t.get("function")}
    options = []
    for name in names:
        if name not in by_name:
            raise GrammarError(f"tool_choice names {name!r}, which is not in tools")
        params = by_name[name].get("parameters") or {"type": "object"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_grammar(
    tools: list[dict[str, Any]], names: list[str], start: str | None, end: str | None, many: bool
) -> str:
    """Output that is one tool call (or several, `many`) in the model's own format: its start
    and end markers around {"name", "arguments"} (mlx-lm's json_tools format); a model with no
    markers answers the bare JSON object."""
    body = "%json " + json.dumps({**_call_schema(tools, names), "x-guidance": JSON_STYLE})
    if start is None or end is None:
        return llguidance.LLMatcher.grammar_from_lark(f"start: {body}")
    call = f"call: {json.dumps(start + chr(10))} {body} {json.dumps(chr(10) + end)}"
    repeat = 'call ("\\n" call)*' if many else "call"
    return llguidance.LLMatcher.grammar_from_lark(f"start: {repeat}\n{call}")


def auto_tool_grammar(
    tools: list[dict[str, Any]], start: str, end: str, many: bool,
    answer: dict[str, Any] | None = None,
) -> str:  # fmt: skip
    """tool_choice "auto" with a strict tool: any text, and wherever the model writes its call
    start marker, a call as the forced grammar has it (a tool's name and its arguments), then
    any text again (one call at most unless `many`). Text without the marker is left alone.
    With `answer` (response_format's schema) the reply is either that JSON or the calls."""
    names = [t["function"]["name"] for t in tools if t.get("function")]
    body = "%json " + json.dumps({**_call_schema(tools, names), "x-guidance": JSON_STYLE})
    close = json.dumps(chr(10) + end)
    if answer is not None:
        calls = 'call ("\\n" call)*' if many else "call"
        return llguidance.LLMatcher.grammar_from_lark(
            f"start: answer | {calls}\n"
            f"answer: %json {json.dumps({**answer, 'x-guidance': JSON_STYLE})}\n"
            f"call: {json.dumps(start + chr(10))} {body} {close}"
        )
    return llguidance.LLMatcher.grammar_from_lark(
        f"start: call{'*' if many else '?'} TEXT\n"
        f"call: head {json.dumps(chr(10))} {body} {close}\n"
        f"head[lazy]: TEXT {json.dumps(start)}\n"  # text up to the first marker, then the call
        "TEXT: /(.|\\n)*/"
    )


def check_grammar(grammar: str, tokenizer: TokenizerWrapper) -> None:
    """Rank 0, before admitting the request: GrammarError naming what llguidance refuses."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, ll_tokenizer(tokenizer)
    )
    if is_error:
        raise GrammarError(messages[0] if messages else "the grammar is not valid")


class GrammarProcessor:
    """An mlx-lm logits processor: only tokens the grammar allows next keep their logits.

    mlx-lm calls it once per step with the tokens so far (prompt included, the token being fed
    last); from the second call on, that last token is the one sampled under the previous mask.
    """

    def __init__(self, grammar: str, tokenizer: TokenizerWrapper) -> None:
        self.matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer), grammar)
        self.started = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.started:
            self.matcher.consume_token(int(np.asarray(tokens[-1:])[0]))
        self.started = True
        vocab = logits.shape[-1]
        bits = allocate_token_bitmask(1, vocab)
        fill_next_token_bitmask(self.matcher, bits, 0)
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab].astype(bool)
        return mx.where(mx.array(allowed)[None], logits, -mx.inf)
