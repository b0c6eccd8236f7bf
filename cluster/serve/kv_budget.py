"""What a set of sequences can cost in KV cache, in tokens, as mlx-lm's batch lays it out.

The batch's cache (mlx-lm's BatchKVCache) is one buffer per layer: every row is left-padded to
the longest row, and the buffer grows in steps of 256 positions by copying it into a larger one,
so for a moment the old buffer, the new step and the new buffer all exist: twice the new size
(measured here: 16 MiB of peak memory for 8 MiB of cache). So k sequences may hold, at the peak
of a growth, 2 × k × (the longest one, rounded up to a step); the budget is checked against
that. A sequence's worst case is its prompt plus max_tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

CACHE_STEP = 256  # mlx-lm's BatchKVCache.step
GROWTH_COPIES = 2  # old + new buffers while the batch's cache grows by a step


def rounded(tokens: int) -> int:
    return -(-tokens // CACHE_STEP) * CACHE_STEP


def batch_tokens(worst: Iterable[int]) -> int:
    """The most KV positions a batch of sequences with these worst cases may hold at once."""
    worst = list(worst)
    return GROWTH_COPIES * len(worst) * rounded(max(worst)) if worst else 0


def per_choice_limit(limit_tokens: int, n: int) -> int:
    """The longest prompt + max_tokens one choice of an n-choice request may have, alone."""
    return (limit_tokens // (GROWTH_COPIES * max(1, n))) // CACHE_STEP * CACHE_STEP
