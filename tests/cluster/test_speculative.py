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
from real_model import needs_smollm2

from cluster.speculative.draft_length import FIRST_DRAFT, MAX_DRAFT, DraftLength
from cluster.speculative.lookup import Prediction, PromptLookup
from cluster.speculative.verify import install


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
) -> dict[int, tuple[list[int], str, list[int], list[Any], Any]]:
    """Sequences joining every third step; (tokens, finish, all_tokens, cache, draft counts)
    per prompt."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        model, stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)], completion_batch_size=8
    )
    registry = None
    if drafts is not None:
        registry = install(gen)
        assert registry is not None
    which: dict[int, int] = {}
    out: dict[int, list[int]] = {}
    done: dict[int, tuple[list[int], str, list[int], list[Any], Any]] = {}
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
                counts = None if registry is None else registry.counts(r.uid)
                done[i] = (out[i], r.finish_reason, list(r.all_tokens), r.prompt_cache, counts)
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
        tokens, finish, all_tokens, cache, _ = drafted[i]
        assert (tokens, finish, all_tokens) == plain[i][:3]
        for a, b in zip(cache, plain[i][3], strict=True):
            assert a.offset == b.offset
            assert mx.allclose(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :], atol=1e-4)
            assert mx.allclose(
                a.values[..., : a.offset, :], b.values[..., : b.offset, :], atol=1e-4
            )


@needs_smollm2
def test_the_real_model_copies_an_edit_with_drafts_and_gives_the_same_text(
    smollm2: dict[str, Path],
) -> None:
    """SmolLM2-135M-Instruct (float32) asked to copy a function back: prompt lookup drafts most
    of the answer, and the text is the plain batch's, token for token."""
    from mlx_lm import load

    model, tokenizer = load(str(smollm2["float32"]))
    code = (
        "def area(width, height):\n"
        '    """The area of a rectangle."""\n'
        "    if width < 0 or height < 0:\n"
        '        raise ValueError("negative size")\n'
        "    return width * height\n"
    )
    ask = f"Copy this function exactly, renaming `width` to `w`:\n\n{code}"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": ask}], add_generation_prompt=True
    )
    question = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    prompts, max_tokens = [list(prompt), list(question)], [80, 20]
    plain = _decode(model, tokenizer, prompts, max_tokens, None)
    drafted = _decode(model, tokenizer, prompts, max_tokens, [None, None])
    for i in range(len(prompts)):
        assert drafted[i][:3] == plain[i][:3], tokenizer.decode(drafted[i][0])
    assert "height" in tokenizer.decode(plain[0][0])  # it did copy the function
    counts = drafted[0][4]
    assert counts.accepted > len(plain[0][0]) // 3, counts  # much of the copy came from drafts
