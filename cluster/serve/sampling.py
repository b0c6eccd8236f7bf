"""Per-request samplers that give the same tokens whatever else is in the batch.

mlx-lm's samplers draw from MLX's global random state, which every sequence of a batch shares, so
a seeded request could not reproduce its solo output inside a batch (mlx-lm's server stops
batching when a request sets a seed). Here each request carries its own key, split once per step:
the draw depends only on the request's seed and its own logits, and is identical on every rank.
Greedy requests share one argmax sampler, so an all-greedy batch samples in one call.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p

Sampler = Callable[[mx.array], mx.array]


def request_sampler(temperature: float, top_p: float, seed: int) -> Sampler | None:
    """None for greedy (the batch's shared argmax), else a sampler with its own key."""
    if temperature <= 0:
        return None
    key = mx.random.key(seed)

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        key, draw = mx.random.split(key)
        if 0 < top_p < 1:
            logprobs = apply_top_p(logprobs, top_p)
        return mx.random.categorical(logprobs * (1 / temperature), key=draw)

    return sample
