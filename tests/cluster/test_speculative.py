"""Speculation's pieces in one process: prompt lookup and predictions, the draft length, and
mlx-lm's batch with drafts against the batch without — staggered sequences of every length, a
draft that is the whole answer, one with wrong tokens, one that starts late — token for token,
with each finished sequence's cache (what the prefix cache keeps) equal to the plain batch's."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from cluster.speculative.draft_length import FIRST_DRAFT, MAX_DRAFT, DraftLength
from cluster.speculative.drafts import Drafts
from cluster.speculative.lookup import Prediction, PromptLookup
from cluster.speculative.verify import DraftingBatch


def test_prompt_lookup_copies_what_followed_the_latest_match() -> None:
    lookup = PromptLookup()
    history = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert lookup.may_match(history)  # [1, 2] came before: [1, 2, next] might
    assert lookup.propose(history, 3, 4) == [4, 5, 6, 7]
    assert lookup.propose(history, 9, 4) == []  # [1, 2, 9] never came: nothing to copy
    assert not lookup.may_match([*history, 9, 8])  # [9, 8] is new: no wait for the next
    again = [7, 8, 9, 1, 7, 8, 9, 2, 7, 8]
    assert PromptLookup().propose(again, 9, 5) == [2, 7, 8]  # the latest earlier occurrence
    assert PromptLookup().propose([4, 5], 6, 3) == []


def test_a_prediction_is_followed_then_found_again() -> None:
    p = Prediction([10, 11, 12, 13, 14, 15])
    assert p.propose([], 3) == [10, 11, 12]
    assert p.propose([10, 11], 3) == [12, 13, 14]
    assert p.propose([99], 3) == []  # the answer left the prediction
    assert p.propose([13, 14], 3) == [15]  # ... and came back to it


def test_draft_length_grows_shrinks_and_pauses() -> None:
    d = DraftLength()
    assert d.ready()
    first = d.limit
    d.record(first, first)
    assert d.limit == 2 * first
    for _ in range(5):
        d.record(d.limit, d.limit)
    assert d.limit == MAX_DRAFT
    d.record(MAX_DRAFT, 2)
    assert d.limit == 3
    d.record(3, 0)  # mostly rejected: no drafts for a while, then a fresh start
    assert [d.ready() for _ in range(4)] == [False] * 4
    assert d.ready() and d.limit == FIRST_DRAFT
    d.record(2, 0)  # missed again at once: the next pause is twice as long
    assert [d.ready() for _ in range(9)] == [False] * 8 + [True]


def _decode(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: list[int], drafts: Any
) -> dict[int, tuple[list[int], str, list[int], list[Any]]]:
    """Sequences joining every third step; (tokens, finish, all_tokens, cache) per prompt."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        model, stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)], completion_batch_size=8
    )
    registry = None
    if drafts is not None:
        registry = Drafts(lookup=True)
        batch = DraftingBatch.empty(model, gen.sampler)
        batch.drafts = registry
        gen._generation_batch = batch
    which: dict[int, int] = {}
    out: dict[int, list[int]] = {}
    done: dict[int, tuple[list[int], str, list[int], list[Any]]] = {}
    step = 0
    while len(done) < len(prompts):
        if step % 3 == 0 and step // 3 < len(prompts):
            i = step // 3
            (uid,) = gen.insert([prompts[i]], max_tokens=[max_tokens[i]])
            which[uid] = i
            if registry is not None:
                registry.expect(uid, drafts[i])
        step += 1
        for r in gen.next()[1]:
            i = which[r.uid]
            out.setdefault(i, []).append(r.token)
            if r.finish_reason is not None:
                done[i] = (out[i], r.finish_reason, list(r.all_tokens), r.prompt_cache)
    return done


@pytest.mark.parametrize("kind", ["whole", "wrong", "late"])
def test_the_batch_with_drafts_gives_the_plain_batch(
    tiny: Callable[[str], Path], kind: str
) -> None:
    from mlx_lm import load

    model, tokenizer = load(str(tiny("llama")))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 250) for _ in range(n)] for n in (30, 50, 12, 80, 7, 64, 33, 20)]
    max_tokens = [40, 33, 60, 25, 50, 41, 39, 64]
    plain = _decode(model, tokenizer, prompts, max_tokens, None)

    def draft(tokens: list[int]) -> list[int]:
        if kind == "whole":
            return tokens
        if kind == "late":
            return tokens[5:]
        wrong = list(tokens)
        for _ in range(len(wrong) // 6):
            wrong[rng.randrange(len(wrong))] = rng.randrange(3, 250)
        return wrong

    drafted = _decode(
        model, tokenizer, prompts, max_tokens, [draft(plain[i][0]) for i in range(len(prompts))]
    )
    for i in range(len(prompts)):
        tokens, finish, all_tokens, cache = drafted[i]
        assert (tokens, finish, all_tokens) == plain[i][:3]
        for a, b in zip(cache, plain[i][3], strict=True):
            assert a.offset == b.offset
            assert mx.allclose(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :], atol=1e-4)
            assert mx.allclose(
                a.values[..., : a.offset, :], b.values[..., : b.offset, :], atol=1e-4
            )
