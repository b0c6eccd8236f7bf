"""A request fails alone: what rank 0 refuses (a seed MLX cannot take, a prompt past the model's
context, a bias on a token the model lacks) and what a sequence's own sampler raises end that
request with its reason, while the batch around it decodes on and later requests are served."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generation_stream
from serving import batch_reference, serving

from cluster.serve.control import Admit, Sampling, Step
from cluster.serve.engine import Engine

PROMPT = [5, 17, 42, 8, 99, 3, 61, 27]
CONTEXT = 4096  # tiny-model's max_position_embeddings


def filler(n: int) -> list[int]:
    return [5 + i % 250 for i in range(n)]  # token ids inside tiny-model's vocabulary


def test_bad_requests_fail_alone_while_the_batch_goes_on(tiny: Callable[[str], Path]) -> None:
    model = tiny("llama")
    (expected,) = batch_reference(model, [PROMPT], 24)
    with serving(model, 2, "tensor", token_delay_s=0.05) as ranks:
        ranks.send("good", PROMPT, 24)
        ranks.wait_for_events("delta", "good", count=2)  # decoding while the bad ones arrive
        ranks.send("seed", PROMPT, 4, temperature=1.0, seed=2**64)
        ranks.send("long", filler(CONTEXT), 4)
        ranks.send("room", PROMPT, CONTEXT)
        ranks.send("bias", PROMPT, 4, logit_bias={"99999999": 5.0})
        # Not asked for: max_tokens shrinks to the 3 tokens the context leaves.
        ranks.send("fits", filler(CONTEXT - 3), CONTEXT, max_tokens_default=True)
        errors = {
            name: ranks.wait_for_events("request_error", name)[0]
            for name in ("seed", "long", "room", "bias")
        }
        assert ranks.done("good")["token_ids"] == expected
        fits = ranks.done("fits")
        ranks.send("after", PROMPT, 24)
        assert ranks.done("after")["token_ids"] == expected
    assert (fits["completion_tokens"], fits["finish_reason"]) == (3, "length")
    assert all(e["kind"] == "input" for e in errors.values())
    assert "seed must be from 0 to 9223372036854775807" in errors["seed"]["message"]
    assert f"this model's context is {CONTEXT}" in errors["long"]["message"]
    assert errors["long"]["code"] == "context_length_exceeded"
    assert f"ask for at most {CONTEXT - len(PROMPT)}" in errors["room"]["message"]
    assert "logit_bias token ids must be in [0, " in errors["bias"]["message"]


def test_a_sampler_that_raises_ends_only_its_sequence(tiny: Callable[[str], Path]) -> None:
    """One process, the engine alone: a sampler raising inside the batch step (top_k past the
    vocabulary, which rank 0 would have turned off) and settings that cannot be built are
    recorded for their sequence; the other sequence's tokens are those of a batch without them."""
    model_dir = tiny("llama")
    model, tokenizer = load(str(model_dir))
    engine = Engine(model, tokenizer, generation_stream, max_running=4, cache_tokens=0)
    vocab = int(model.args.vocab_size)
    raising = Sampling(temperature=1.0, top_k=vocab + 10)
    unbuildable = Sampling(repetition_penalty=-1.0)  # mlx-lm refuses a negative penalty
    add = [Admit(PROMPT, 12), Admit(PROMPT, 12, raising), Admit(PROMPT, 12, unbuildable)]
    good, bad, refused = engine.apply(Step(steps=1, chunk=64, add=add))
    assert isinstance(good, int) and isinstance(bad, int)
    assert isinstance(refused, str) and "penalty" in refused
    tokens: list[int] = []
    faults: dict[int, str] = {}
    while not engine.idle and len(tokens) < 12:
        _, responses = engine.next()
        faults.update(engine.failed())
        if bad in faults and bad in engine.active:
            engine.apply(Step(remove=[bad]))
        tokens += [r.token for r in responses if r.uid == good]
    assert list(faults) == [bad] and "ValueError" in faults[bad]
    assert tokens == batch_reference(model_dir, [PROMPT], 12)[0]
    mx.clear_cache()
