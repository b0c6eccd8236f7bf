"""Speculative decoding on real ranks (ring backend on 127.0.0.1): a mixed batch with drafts
gives exactly the tokens of `--speculative off` — 1 rank, tensor ×2, tensor ×3 (uneven shares)
and pipeline ×2 — greedy and seeded, with logprobs, penalties, a logit bias, a grammar, a forced
tool call, n = 2, a stop string and max_tokens reached mid-draft; and the drafts are really
checked (accepted counts in every `done`)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from serving import batch_reference, logit_gap, serving

from cluster.load import tensor_share

PROMPT = [5, 17, 42, 8, 99, 3, 61, 27, 11, 12, 13, 40, 41, 7]
MAX_TOKENS = 24
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def _cases(stop: str) -> dict[str, dict[str, Any]]:
    """Request fields by name; every request shares the prompt's start, so they batch."""
    return {
        "greedy": {},
        "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 7},
        "logprobs": {"logprobs": 3},
        "penalties": {
            "repetition_penalty": 1.3,
            "presence_penalty": 0.5,
            "logit_bias": {"17": 3.0},
        },
        "json": {"response_format": {"type": "json_object"}},
        "n2": {"n": 2, "temperature": 0.7, "seed": 3},
        "short": {"max_tokens": 5},  # ends while a longer draft is checked
        "stop": {"stop": [stop]},
        # A forced tool call: its grammar rejects drafted tokens it forbids, and the call is
        # parsed from the same tokens.
        "tool": {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 60},
    }


def _run(model: Path, n: int, strategy: str, bodies: dict[str, dict[str, Any]], **opts: Any):
    with serving(model, n, strategy, **opts) as ranks:
        for i, (name, fields) in enumerate(bodies.items()):
            ranks.send(name, [*PROMPT, i + 50], fields.pop("max_tokens", MAX_TOKENS), **fields)
        done = {
            name: ranks.wait_for_events("done", name, bodies_n(bodies[name])) for name in bodies
        }
        deltas = {name: ranks.events("delta", name) for name in bodies}
    return done, deltas


def bodies_n(fields: dict[str, Any]) -> int:
    return int(fields.get("n", 1))


def _tokens(done: list[dict[str, Any]]) -> list[list[int]]:
    return [d["token_ids"] for d in sorted(done, key=lambda d: d["index"])]


def _corrupt(tokens: list[int], seed: int) -> list[int]:
    rng = random.Random(seed)
    out = list(tokens)
    for _ in range(max(1, len(out) // 6)):
        out[rng.randrange(len(out))] = rng.randrange(3, 300)
    return out


@pytest.mark.parametrize(
    ("n", "strategy"), [(1, "tensor"), (2, "tensor"), (3, "tensor"), (2, "pipeline")]
)
def test_drafts_change_nothing_but_the_steps(
    tiny: Callable[[str], Path], n: int, strategy: str
) -> None:
    model = tiny("llama")
    if n == 3:  # 8 heads / 4 KV heads do not divide by 3: the ranks' shares really differ
        cfg = json.loads((model / "config.json").read_text())
        heads = [tensor_share(cfg, r, n, None)[0].n_heads for r in range(n)]
        assert sum(heads) == 8 and len(set(heads)) > 1, heads
    from mlx_lm import load

    _, tokenizer = load(str(model))
    stop_prompt = [*PROMPT, 50 + list(_cases("")).index("stop")]
    ref = batch_reference(model, [stop_prompt], MAX_TOKENS)[0]
    text = tokenizer.decode(ref)
    stop = text[len(text) // 2 : len(text) // 2 + 2]

    off_done, off_deltas = _run(model, n, strategy, _cases(stop), speculative="off")
    assert all("drafted_tokens" not in d for ds in off_done.values() for d in ds)

    # The drafts: each request's own answer (whole, or with every sixth token wrong).
    on_cases = _cases(stop)
    for i, (name, fields) in enumerate(on_cases.items()):
        answer = _tokens(off_done[name])[0]
        fields["prediction_ids"] = answer if i % 2 == 0 else _corrupt(answer, i)
    on_done, on_deltas = _run(model, n, strategy, on_cases)

    for name in on_cases:
        got, want = _tokens(on_done[name]), _tokens(off_done[name])
        for g, w in zip(got, want, strict=True):
            if g != w:  # only a floating-point near-tie may tell them apart
                k = next(j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b)
                gap = logit_gap(
                    model, [*PROMPT, list(on_cases).index(name) + 50, *w[:k]], g[k], w[k]
                )
                print(f"{name}: token {k} differs ({g[k]} vs {w[k]}), logit gap {gap:.2e}")
                assert gap < 1e-4, f"{name}: token {k} differs with a logit gap of {gap}"
                break
    # The forced call is a call with speculation too (and its drafts were checked).
    call = tokenizer.decode(_tokens(on_done["tool"])[0])
    assert call.replace(" ", "").startswith('<tool_call>\n{"name":"get_weather","arguments":{'), (
        call
    )
    assert on_done["tool"][0]["draft_checks"] > 0
    # Each emitted token's logprobs are the target's.
    on_lp = [e for d in on_deltas["logprobs"] for e in d.get("logprobs", [])]
    off_lp = [e for d in off_deltas["logprobs"] for e in d.get("logprobs", [])]
    assert [e["token"] for e in on_lp] == [e["token"] for e in off_lp]
    for a, b in zip(on_lp, off_lp, strict=True):
        assert abs(a["logprob"] - b["logprob"]) < 1e-4
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]
    assert "stop_sequence" in on_done["stop"][0] and "stop_sequence" in off_done["stop"][0]
    # Drafts were checked and accepted: a whole-answer prediction is taken nearly whole.
    greedy = on_done["greedy"][0]
    assert greedy["accepted_prediction_tokens"] >= len(greedy["token_ids"]) // 2
    assert greedy["draft_checks"] < len(greedy["token_ids"])
    for name, ds in on_done.items():
        for d in ds:
            assert d["drafted_tokens"] >= d["accepted_tokens"] >= 0, name
            assert (
                d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"]
                <= d["drafted_tokens"]
            )
