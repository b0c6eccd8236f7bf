"""Rank 0's view of one request: its line from the launcher, its prompt tokens, its output.

Requests arrive as JSON lines on rank 0's stdin (launcher/serve/openai_api.py writes them);
`{"cancel": id}` withdraws one. Output leaves through output.py as events tagged with the
request's id and the choice's index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.serve.constraints import (
    GrammarError,
    auto_tool_grammar,
    check_grammar,
    json_grammar,
    tool_call_grammar,
)
from cluster.serve.control import Sampling
from cluster.serve.kv_budget import per_choice_limit
from cluster.serve.tool_stream import json_calls

MAX_SEED = 2**63 - 1  # seeds are int64 for OpenAI; n choices add their index, and MLX takes uint64


class RequestError(Exception):
    """A request rank 0 cannot run (bad prompt): reported for that request, nothing broadcast."""

    def __init__(self, message: str, request_id: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.request_id, self.code = request_id, code


@dataclass(frozen=True)
class Limits:
    """What the model accepts: checked on rank 0 before a request reaches the batch."""

    vocab: int  # width of the logits (token ids and logit_bias keys must be below it)
    context: int | None = None  # max_position_embeddings: prompt + max_tokens must fit
    # The KV positions the batch may hold (the memory budget, cluster/serve/kv_budget.py):
    # each choice's prompt + max_tokens must fit alone; None: not bounded.
    kv_tokens: int | None = None


@dataclass(frozen=True)
class Request:
    id: str
    ids: list[int]
    max_tokens: int
    sampling: Sampling
    stop: list[str] = field(default_factory=list)
    n: int = 1  # choices: n sequences of the batch sharing the prompt
    logprobs: int | None = None  # top alternatives per token (0: the chosen only; None: off)
    tools: list[dict[str, Any]] | None = None
    tool_mode: str = "none"  # auto: parse the model's calls; forced: the grammar makes calls
    forced_names: tuple[str, ...] = ()  # forced: the tools the grammar lets it call
    count_only: bool = False  # only count the prompt's tokens
    prediction: list[int] | None = None  # the client's predicted output, as a draft source


@dataclass(frozen=True)
class Cancel:
    id: str


def prompt_ids(request: dict[str, Any], tokenizer: TokenizerWrapper, vocab: int) -> list[int]:
    """Chat messages (and tools) through the model's chat template; a raw prompt as mlx-lm
    encodes it."""
    if request.get("messages") is not None:
        if not tokenizer.has_chat_template:
            raise RequestError("this model has no chat template: use /v1/completions")
        extra = {"tools": request["tools"]} if request.get("tools") else {}
        try:
            ids = tokenizer.apply_chat_template(
                request["messages"], add_generation_prompt=True, **extra
            )
        except Exception as e:  # a template may reject roles or orderings
            raise RequestError(f"the chat template rejected the messages: {e}") from None
        return [int(i) for i in ids]
    if request.get("prompt_ids") is not None:
        ids = [int(i) for i in request["prompt_ids"]]
        if any(not 0 <= i < vocab for i in ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        return ids
    prompt = str(request.get("prompt", ""))
    # As stream_generate encodes a string: special tokens unless it already starts with BOS.
    bos = tokenizer.bos_token
    return list(
        tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
    )


def _json_tool_markers(tokenizer: TokenizerWrapper) -> tuple[str | None, str | None]:
    """The model's call markers when its calls are {"name", "arguments"} JSON between them
    (mlx-lm's json_tools format); else none: a forced call is then the bare JSON object."""
    if json_calls(tokenizer):
        return tokenizer.tool_call_start, tokenizer.tool_call_end
    return None, None


Tools = tuple[str, tuple[str, ...], str | None]


def _tools(raw: dict[str, Any], tokenizer: TokenizerWrapper) -> Tools:
    """(tool mode, the names a forced call may take, the grammar forcing calls or None)."""
    tools = raw.get("tools") or []
    choice: Any = raw.get("tool_choice") or "auto"  # "auto" | "none" | "required" | {"name"}
    if not tools or choice == "none":
        return "none", (), None
    if choice == "auto":
        if not tokenizer.has_tool_calling:
            return "none", (), None
        start, end = _json_tool_markers(tokenizer)
        if not raw.get("strict_tools") or start is None or end is None:
            return "auto", (), None
        # A strict tool: whatever call the model starts is held to its schema (OpenAI's rule).
        many = bool(raw.get("parallel_tool_calls", True))
        return "auto", (), auto_tool_grammar(tools, start, end, many, _answer_schema(raw))
    if choice == "required":
        names = [t["function"]["name"] for t in tools if t.get("function")]
    else:
        names = [str(choice["name"])]
    start, end = _json_tool_markers(tokenizer)
    many = bool(raw.get("parallel_tool_calls", True)) and choice == "required"
    return "forced", tuple(names), tool_call_grammar(tools, names, start, end, many)


def _answer_schema(raw: dict[str, Any]) -> dict[str, Any] | None:
    """response_format's schema ({"type": "object"} for json_object), None when it has none."""
    fmt = raw.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return dict(fmt.get("schema") or {"type": "object"})
    return {"type": "object"} if fmt.get("type") == "json_object" else None


def _grammar(raw: dict[str, Any], tokenizer: TokenizerWrapper) -> Tools:
    mode, names, grammar = _tools(raw, tokenizer)
    if grammar is None and (answer := _answer_schema(raw)) is not None:
        grammar = json_grammar(answer)
    if grammar is not None:
        check_grammar(grammar, tokenizer)
    return mode, names, grammar


def _sampling(raw: dict[str, Any], grammar: str | None, vocab: int) -> Sampling:
    bias = {int(k): float(v) for k, v in (raw.get("logit_bias") or {}).items()}
    if any(not 0 <= k < vocab for k in bias):
        raise RequestError(f"logit_bias token ids must be in [0, {vocab})")
    seed = int(raw["seed"])
    if not 0 <= seed <= MAX_SEED:
        raise RequestError(f"seed must be from 0 to {MAX_SEED}")
    top_k = int(raw.get("top_k") or 0)
    return Sampling(
        temperature=float(raw["temperature"]),
        top_p=float(raw["top_p"]),
        top_k=top_k if 0 < top_k < vocab else 0,  # keeping the whole vocabulary is no filter
        min_p=float(raw.get("min_p") or 0.0),
        seed=seed,
        presence_penalty=float(raw.get("presence_penalty") or 0.0),
        frequency_penalty=float(raw.get("frequency_penalty") or 0.0),
        repetition_penalty=float(raw.get("repetition_penalty") or 0.0),
        logit_bias={str(k): v for k, v in bias.items()},
        grammar=grammar,
    )


def _max_tokens(raw: dict[str, Any], prompt: int, context: int | None) -> int:
    """max_tokens, checked against the model's context: a prompt that leaves no room is refused
    with the limit named; a default (not asked for) shrinks to the room left."""
    asked = int(raw["max_tokens"])
    if not asked >= 1:
        raise RequestError("max_tokens must be at least 1")
    if context is None:
        return asked
    room = context - prompt
    if room < 1:
        raise RequestError(
            f"the prompt is {prompt} tokens and this model's context is {context}: "
            "shorten the prompt",
            code="context_length_exceeded",
        )
    if asked > room and not raw.get("max_tokens_default"):
        raise RequestError(
            f"max_tokens {asked} + the prompt's {prompt} tokens exceed this model's context of "
            f"{context} tokens: ask for at most {room}",
            code="context_length_exceeded",
        )
    return min(asked, room)


def _fit_budget(raw: dict[str, Any], prompt: int, asked: int, n: int, kv_tokens: int | None) -> int:
    """max_tokens against the memory budget: a request whose choices could never fit, even
    alone in the batch, is refused with the limit in tokens; a default shrinks to fit."""
    if kv_tokens is None:
        return asked
    limit = per_choice_limit(kv_tokens, n)
    each = f" for each of its n={n} choices" if n > 1 else ""
    if prompt >= limit:
        raise RequestError(
            f"the prompt is {prompt} tokens and the cluster's memory budget holds at most {limit} "
            f"tokens of KV cache (prompt + max_tokens){each}: shorten the prompt",
            code="kv_budget_exceeded",
        )
    if prompt + asked > limit and not raw.get("max_tokens_default"):
        raise RequestError(
            f"max_tokens {asked} + the prompt's {prompt} tokens exceed the cluster's memory "
            f"budget of {limit} tokens of KV cache{each}: ask for at most {limit - prompt}",
            code="kv_budget_exceeded",
        )
    return min(asked, limit - prompt)


def _prediction(raw: dict[str, Any], tokenizer: TokenizerWrapper, vocab: int) -> list[int] | None:
    """The predicted output's tokens: the launcher sends text (checked to be text there);
    `prediction_ids` are token ids, as `prompt_ids` are."""
    if raw.get("prediction_ids") is not None:
        ids = [int(i) for i in raw["prediction_ids"]]
        if any(not 0 <= i < vocab for i in ids):
            raise RequestError(f"prediction token ids must be in [0, {vocab})")
        return ids or None
    text = raw.get("prediction")
    if not text:
        return None
    return [int(i) for i in tokenizer.encode(str(text), add_special_tokens=False)] or None


def parse_line(line: str, tokenizer: TokenizerWrapper, limits: Limits) -> Request | Cancel:
    """One stdin line → a request or a cancel; RequestError (with the id when known) if bad."""
    request_id = ""
    try:
        raw = json.loads(line)
        if "cancel" in raw:
            return Cancel(str(raw["cancel"]))
        request_id = str(raw["id"])
        ids = prompt_ids(raw, tokenizer, limits.vocab)
        if not ids:
            raise RequestError("the prompt is empty after tokenization")
        if raw.get("count_only"):
            return Request(request_id, ids, 0, Sampling(), count_only=True)
        max_tokens = _max_tokens(raw, len(ids), limits.context)
        n = max(1, int(raw.get("n") or 1))
        max_tokens = _fit_budget(raw, len(ids), max_tokens, n, limits.kv_tokens)
        mode, names, grammar = _grammar(raw, tokenizer)
        logprobs = raw.get("logprobs")
        return Request(
            id=request_id,
            ids=ids,
            max_tokens=max_tokens,
            sampling=_sampling(raw, grammar, limits.vocab),
            stop=[str(s) for s in raw.get("stop") or []],
            n=n,
            logprobs=None if logprobs is None else int(logprobs),
            tools=raw.get("tools") or None,
            tool_mode=mode,
            forced_names=names,
            prediction=_prediction(raw, tokenizer, limits.vocab),
        )
    except GrammarError as e:
        raise RequestError(f"response_format / tools: {e}", request_id) from None
    except RequestError as e:
        raise RequestError(str(e), request_id, e.code) from None
    except Exception as e:  # whatever else this request's contents raise, it fails alone
        raise RequestError(f"bad request: {type(e).__name__}: {e}", request_id) from None


class StopScanner:
    """Cuts the text before the first stop string, and holds back a tail that could still
    grow into one, so streamed text never shows part of a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""  # text not sent yet: it may be the start of a stop string
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string ended the text)."""
        text = self.pending + piece
        hits = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            first, self.matched = min(hits, key=lambda h: h[0])
            self.pending = ""
            return text[:first], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self.pending = text[len(text) - hold :]
        return text[: len(text) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
