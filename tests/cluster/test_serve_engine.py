"""Continuous batching on real ranks (ring backend on 127.0.0.1), driven as the launcher drives
rank 0: the batch gives mlx-lm's own batch_generate tokens, requests that join a running batch
get their solo tokens, and a prefix-cache hit changes nothing but the work done."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest
from serving import batch_reference, logit_gap, request, serving

from topology.planning.tensor_shares import RankShare

PROMPTS = [
    [5, 17, 42, 8, 99, 3, 61, 27],
    [11, 12, 13],
    [40, 41, 7, 7, 7, 9, 30, 31, 32, 33, 34],
    [70, 2],
]
MAX_TOKENS = 12


@pytest.mark.parametrize(
    ("name", "strategy"), [("llama", "tensor"), ("llama", "pipeline"), ("qwen2", "pipeline")]
)
def test_static_batch_gives_batch_generate_tokens(
    tiny: Callable[[str], Path], name: str, strategy: str
) -> None:
    model = tiny(name)
    expected = batch_reference(model, PROMPTS, MAX_TOKENS)
    early = [request(f"r{i}", p, MAX_TOKENS) for i, p in enumerate(PROMPTS)]
    with serving(model, 2, strategy, early) as ranks:
        got = [ranks.done(f"r{i}")["token_ids"] for i in range(len(PROMPTS))]
        begins = ranks.events("begin")
    assert got == expected
    assert len(begins) == len(PROMPTS)


def test_a_batch_of_8_over_3_uneven_tensor_ranks_gives_batch_generate_tokens(
    tiny: Callable[[str], Path],
) -> None:
    """8 heads / 4 KV heads over 3 ranks: unequal shares (8 heads do not split 3 ways)."""
    model = tiny("llama")
    prompts = PROMPTS + [p[::-1] for p in PROMPTS]
    expected = batch_reference(model, prompts, MAX_TOKENS)
    early = [request(f"r{i}", p, MAX_TOKENS) for i, p in enumerate(prompts)]
    with serving(model, 3, "tensor", early) as ranks:
        got = [ranks.done(f"r{i}")["token_ids"] for i in range(len(prompts))]
    assert got == expected


def test_a_batch_over_shares_of_several_attention_calls_gives_batch_generate_tokens(
    tiny: Callable[[str], Path],
) -> None:
    """8 heads / 4 KV heads as runs across KV rows: heads 0-2, 3-5, 6-7 (two calls on ranks 0
    and 1, KV head 1 on both): the batch's masks and caches split by call too."""
    from topology.planning.head_tiling import run_blocks

    model = tiny("llama")
    prompts = PROMPTS + [p[::-1] for p in PROMPTS]
    expected = batch_reference(model, prompts, MAX_TOKENS)
    bounds, mlp = (0, 3, 6, 8), (0, 96, 192, 256)
    shares = [
        RankShare(run_blocks(a, b, 2), {"mlp": (c, d)}).to_json()
        for (a, b), (c, d) in zip(pairwise(bounds), pairwise(mlp), strict=True)
    ]
    assert [len(s["attention"]) for s in shares] == [2, 2, 1]
    early = [request(f"r{i}", p, MAX_TOKENS) for i, p in enumerate(prompts)]
    with serving(model, 3, "tensor", early, shares=shares) as ranks:
        got = [ranks.done(f"r{i}")["token_ids"] for i in range(len(prompts))]
    assert got == expected


def _assert_same_or_near_tie(
    model: Path, prompt: list[int], got: list[int], solo: list[int]
) -> None:
    if got == solo:
        return
    i = next(k for k, (a, b) in enumerate(zip(got, solo, strict=False)) if a != b)
    gap = logit_gap(model, prompt + solo[:i], got[i], solo[i])
    assert gap < 1e-3, f"token {i} differs ({got[i]} vs {solo[i]}) with a logit gap of {gap}"


def test_requests_joining_a_running_batch_get_their_solo_tokens(
    tiny: Callable[[str], Path],
) -> None:
    model = tiny("llama")
    first, *later = PROMPTS
    solo = [batch_reference(model, [p], 24)[0] for p in PROMPTS]
    with serving(model, 2, "tensor", token_delay_s=0.05) as ranks:
        ranks.send("first", first, 24)
        ranks.wait_for_events("delta", "first", count=3)  # decoding when the others arrive
        for i, p in enumerate(later):
            ranks.send(f"later{i}", p, 24)
        got = [ranks.done("first")["token_ids"]]
        got += [ranks.done(f"later{i}")["token_ids"] for i in range(len(later))]
        order = [(e["event"], e.get("id")) for e in ranks.all_events()]
    # The first was still decoding when the others joined the batch.
    assert order.index(("begin", "later0")) < order.index(("done", "first"))
    for prompt, g, s in zip(PROMPTS, got, solo, strict=True):
        _assert_same_or_near_tie(model, prompt, g, s)


def test_a_prefix_cache_hit_reports_cached_tokens_and_gives_the_tokens_of_a_miss(
    tiny: Callable[[str], Path],
) -> None:
    model = tiny("llama")
    turn1 = PROMPTS[0] * 4
    with serving(model, 2, "tensor") as ranks:
        ranks.send("turn1", turn1, 16)
        answer = ranks.done("turn1")["token_ids"]
        turn2 = turn1 + answer + [11, 12, 13]
        ranks.send("turn2", turn2, 16)
        hit = ranks.done("turn2")
        ranks.send("again", turn2, 16)  # the whole prompt is cached now but its last token
        again = ranks.done("again")
    assert hit["cached_tokens"] >= len(turn1)
    assert again["cached_tokens"] == len(turn2) - 1
    miss = batch_reference(model, [turn2], 16)[0]
    assert hit["token_ids"] == miss
    assert again["token_ids"] == miss
