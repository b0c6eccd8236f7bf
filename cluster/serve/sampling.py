"""Per-request samplers that give the same tokens whatever else is in the batch.

mlx-lm's samplers draw from MLX's global random state, which every sequence of a batch shares, so
a seeded request could not reproduce its solo output inside a batch (mlx-lm's server stops
batching when a request sets a seed). Here each request carries its own key, split once per step:
the draw depends only on the request's seed and its own logits, and is identical on every rank.
Greedy requests share one argmax sampler, so an all-greedy batch samples in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.serve.constraints import GrammarProcessor
from cluster.serve.control import Sampling

Sampler = Callable[[mx.array], mx.array]
Processor = Callable[[mx.array, mx.array], mx.array]


def request_sampler(s: Sampling) -> Sampler | None:
    """None for greedy (the batch's shared argmax), else a sampler with its own key. The
    filters run in mlx-lm's order (top-p, min-p, top-k) with mlx-lm's own functions."""
    if s.temperature <= 0:
        return None
    key = mx.random.key(s.seed)

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        key, draw = mx.random.split(key)
        if 0 < s.top_p < 1:
            logprobs = apply_top_p(logprobs, s.top_p)
        if s.min_p > 0:
            logprobs = apply_min_p(logprobs, s.min_p)
        if s.top_k > 0:
            logprobs = apply_top_k(logprobs, s.top_k)
        return mx.random.categorical(logprobs * (1 / s.temperature), key=draw)

    return sample


def request_processors(s: Sampling, tokenizer: TokenizerWrapper) -> list[Processor]:
    """mlx-lm's own penalty and bias processors, then the grammar's mask (last, so nothing
    can lift a token the grammar forbids)."""
    processors: list[Processor] = make_logits_processors(
        {int(k): v for k, v in s.logit_bias.items()} or None,
        s.repetition_penalty or None,
        presence_penalty=s.presence_penalty or None,
        frequency_penalty=s.frequency_penalty or None,
    )
    if s.grammar is not None:
        processors.append(GrammarProcessor(s.grammar, tokenizer))
    return processors


@dataclass
class Fault:
    """What one sequence's own code (sampler, processors) raised, if anything: the request then
    ends with that error and the batch goes on (set the same way on every rank)."""

    message: str | None = None

    def catch(self, e: Exception) -> None:
        if self.message is None:
            self.message = f"{type(e).__name__}: {e}"


def guarded(
    sampler: Sampler | None, processors: list[Processor], fault: Fault
) -> tuple[Sampler | None, list[Processor]]:
    """The sequence's sampler and processors, made unable to raise into the batch step: a
    failure is recorded in `fault`, and from then on the logits pass through and the token is the
    argmax, until the sequence is taken out at the next decision."""

    def process(p: Processor) -> Processor:
        def run(tokens: mx.array, logits: mx.array) -> mx.array:
            if fault.message is None:
                try:
                    return p(tokens, logits)
                except Exception as e:
                    fault.catch(e)
            return logits

        return run

    def sample(logprobs: mx.array) -> mx.array:
        if fault.message is None and sampler is not None:
            try:
                return sampler(logprobs)
            except Exception as e:
                fault.catch(e)
        return mx.argmax(logprobs, axis=-1)

    return (None if sampler is None else sample), [process(p) for p in processors]
