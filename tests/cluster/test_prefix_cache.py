"""The prefix cache's bookkeeping, with real mlx-lm KV caches: the longest usable prefix, at
least one token left to compute, eviction by tokens in least-recently-used order, and the same
decisions on every rank (they depend only on the calls, never on a rank's bytes)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from cluster.serve.prefix_cache import PrefixCache


def kv(n: int, heads: int = 2) -> list[KVCache]:
    """A one-layer cache holding n tokens (values = positions, to check trimming)."""
    c = KVCache()
    pos = mx.broadcast_to(mx.arange(n, dtype=mx.float32)[None, None, :, None], (1, heads, n, 4))
    c.update_and_fetch(pos, pos)
    return [c]


def test_longest_usable_prefix_and_a_trimmed_private_copy() -> None:
    cache = PrefixCache(max_tokens=1000)
    cache.insert([1, 2, 3, 4, 5, 6], kv(6))
    cache.insert([1, 2, 9], kv(3))
    assert cache.lookup([1, 2, 3, 4, 7]) == (0, 4)
    assert cache.lookup([1, 2, 3, 4, 5, 6]) == (0, 5)  # one token is always left to compute
    assert cache.lookup([8, 8]) is None
    layers, head = cache.take(0, 4)
    assert head == [1, 2, 3, 4]
    assert layers[0].offset == 4
    assert mx.array_equal(layers[0].state[0][0, 0, :4, 0], mx.arange(4, dtype=mx.float32))
    layers[0].trim(2)  # the copy is private: the entry still holds 6 tokens
    assert cache.take(0, 6)[0][0].offset == 6
    assert (cache.hits, cache.lookups) == (2, 3)


def test_a_longer_entry_replaces_its_prefixes_and_eviction_counts_tokens_lru_first() -> None:
    cache = PrefixCache(max_tokens=10)
    cache.insert([1, 2, 3], kv(3))
    cache.insert([1, 2, 3, 4, 5], kv(5))  # covers the first: it goes
    assert len(cache) == 1 and cache.tokens == 5
    cache.insert([7, 7, 7, 7], kv(4))
    cache.take(1, 4)  # entry 1 ([1..5]) used: now the most recent
    cache.insert([8, 8, 8], kv(3))  # 12 tokens > 10: the least recently used ([7...]) goes
    assert cache.tokens == 8 and cache.lookup([7, 7, 7, 7, 1]) is None
    assert cache.lookup([1, 2, 3, 4, 5, 6]) == (1, 5)
    cache.insert(list(range(11)), kv(11))  # larger than the whole bound: not kept
    assert cache.tokens == 8


def test_every_rank_makes_the_same_decisions_whatever_its_bytes() -> None:
    """Pipeline stages hold different bytes per token; the bound is in tokens, so two caches
    fed the same calls with different head counts keep the same entries."""
    a, b = PrefixCache(max_tokens=12), PrefixCache(max_tokens=12)
    for tokens in ([1, 2, 3, 4], [5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6], [9, 9, 9]):
        a.insert(tokens, kv(len(tokens), heads=2))
        b.insert(tokens, kv(len(tokens), heads=8))
    assert a.nbytes != b.nbytes
    assert [a.lookup(p) for p in ([1, 2, 3, 4, 5, 6, 7], [5, 6, 7, 8, 9, 0], [9, 9, 9, 9])] == [
        b.lookup(p) for p in ([1, 2, 3, 4, 5, 6, 7], [5, 6, 7, 8, 9, 0], [9, 9, 9, 9])
    ]


def test_a_missing_entry_is_a_loud_error() -> None:
    with pytest.raises(RuntimeError, match="missing on this rank"):
        PrefixCache(max_tokens=10).take(3, 1)
