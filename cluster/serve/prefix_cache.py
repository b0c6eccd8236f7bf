"""KV caches of earlier sequences, kept by token prefix so a new request skips what it shares.

Each rank keeps its own shard's slice of every entry. The cache must stay identical in content
and order on every rank, or rank 0 would pick an entry another rank has dropped: every rank makes
the same inserts at the same steps (they come from the batch's own, identical responses), entries
are numbered in insertion order, and the bound is counted in tokens (the launcher converts the
byte budget with the heaviest rank's KV bytes per token), never in a rank's own bytes, which
differ between pipeline stages. Only rank 0 looks up; it names the entry in the step message.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

MAX_ENTRIES = 64


@dataclass
class Entry:
    tokens: np.ndarray  # int64 token ids the cache holds, in order
    cache: list[Any]  # one mlx-lm cache per layer of this rank's shard
    trimmable: bool


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    def __init__(self, max_tokens: int, max_entries: int = MAX_ENTRIES) -> None:
        self.max_tokens, self.max_entries = max_tokens, max_entries
        self.limit = max_tokens  # the bound now: below max_tokens while its share is lent
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._next_id = 0
        self.tokens = 0  # held, counted as the bound counts them
        self.hits = self.lookups = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """This rank's bytes (for metrics only: the bound is in tokens)."""
        return sum(c.nbytes for e in self._entries.values() for c in e.cache)

    def lookup(self, prompt: list[int]) -> tuple[int, int] | None:
        """Rank 0: (entry id, tokens to reuse) for the longest usable prefix, or None. At least
        one prompt token is always left to compute: the batch needs an input to start from."""
        self.lookups += 1
        ids = np.asarray(prompt, dtype=np.int64)
        best: tuple[int, int] | None = None
        for entry_id, e in self._entries.items():
            shared = common_prefix(e.tokens, ids)
            if e.trimmable:
                usable = min(shared, len(ids) - 1)
            else:  # an untrimmable cache can only be used whole, as a strict prefix
                usable = len(e.tokens) if shared == len(e.tokens) < len(ids) else 0
            if usable > 0 and (best is None or usable > best[1]):
                best = (entry_id, usable)
        if best is not None:
            self.hits += 1
            self.reused_tokens += best[1]
        return best

    def take(self, entry_id: int, reuse: int) -> tuple[list[Any], list[int]]:
        """Every rank: a private copy of the entry cut to `reuse` tokens, and those tokens."""
        entry = self._entries.get(entry_id)
        if entry is None:  # the ranks' caches diverged: a bug, and decoding would go wrong
            raise RuntimeError(f"prefix cache entry {entry_id} is missing on this rank")
        self._entries.move_to_end(entry_id)
        cache = copy.deepcopy(entry.cache)
        if len(entry.tokens) > reuse:
            trim_prompt_cache(cache, len(entry.tokens) - reuse)
        return cache, [int(t) for t in entry.tokens[:reuse]]

    def insert(self, tokens: list[int], cache: list[Any]) -> None:
        """Every rank, at the same step: keep `cache` (which holds `tokens`)."""
        if not tokens or len(tokens) > self.limit:
            return
        ids = np.asarray(tokens, dtype=np.int64)
        trimmable = can_trim_prompt_cache(cache)
        for entry_id, e in list(self._entries.items()):
            same = len(e.tokens) == len(ids) and common_prefix(e.tokens, ids) == len(ids)
            # A shorter trimmable entry inside the new one only takes room: the new one serves it.
            covered = trimmable and len(e.tokens) < len(ids)
            if same or (covered and common_prefix(e.tokens, ids) == len(e.tokens)):
                self._drop(entry_id)
        self._entries[self._next_id] = Entry(ids, cache, trimmable)
        self._next_id += 1
        self.tokens += len(ids)
        self._evict()

    def bound(self, tokens: int) -> None:
        """Every rank, at the same step: hold at most `tokens` (never above max_tokens) from
        now on, least recently used entries going first. The memory budget lends the rest of
        the share to running sequences; a larger bound gives it back to the cache."""
        self.limit = max(0, min(tokens, self.max_tokens))
        self._evict()

    def _evict(self) -> None:
        while self.tokens > self.limit or len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, entry_id: int) -> None:
        self.tokens -= len(self._entries.pop(entry_id).tokens)
