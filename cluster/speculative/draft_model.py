"""Drafts from a small model of the same vocabulary (`--draft-model`), made on rank 0 only.

Each drafting sequence keeps its own single-row cache of the draft model. Before a draft, the
cache is cut back to what it shares with the sequence's tokens (a rejected draft's tail goes) and
fed the rest; then the draft model's greedy tokens are the draft. Any draft is exact to check
(verify.py keeps only what the target itself draws), so greedy drafts serve sampled requests too.
The other ranks never load it: rank 0 sends them the drafts (Drafts.exchange).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

PREFILL_CHUNK = 512  # prompt tokens per draft-model forward when a sequence starts


@dataclass
class _Row:
    cache: list[Any]
    fed: list[int] = field(default_factory=list)  # the tokens the cache holds, in order


class ModelDrafter:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._rows: dict[int, _Row] = {}

    def propose(self, uid: int, history: list[int], pending: int, limit: int) -> list[int]:
        """Up to `limit` greedy tokens of the draft model after `history` + `pending`."""
        row = self._rows.get(uid)
        if row is None:
            row = self._rows[uid] = _Row(make_prompt_cache(self.model))
        context = [*history, pending]
        keep = _common_prefix(row.fed, context, len(context) - 1)  # feed at least one token
        if keep < len(row.fed):
            for c in row.cache:
                c.trim(len(row.fed) - keep)
            del row.fed[keep:]
        todo = context[keep:]
        while len(todo) > PREFILL_CHUNK:
            self._forward(row, todo[:PREFILL_CHUNK])
            todo = todo[PREFILL_CHUNK:]
        token = self._forward(row, todo)
        draft = [token]
        while len(draft) < limit:
            draft.append(self._forward(row, [draft[-1]]))
        return draft

    def _forward(self, row: _Row, tokens: list[int]) -> int:
        """Feed `tokens`; the greedy next token after them."""
        logits = self.model(mx.array([tokens], dtype=mx.int32), cache=row.cache)
        token = mx.argmax(logits[0, -1], axis=-1)
        mx.eval(token)
        row.fed.extend(tokens)
        return int(np.asarray(token))

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens a and b share, at most `limit` (usually all of them: a cache
    differs from its sequence only in its last draft's tail, compared at C speed first)."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def load_drafter(model: str) -> ModelDrafter:
    """The draft model (a folder or a Hub repo id, loaded whole); a model whose cache cannot
    give entries back (sliding windows, SSM layers) cannot follow rejected drafts: refused."""
    from mlx_lm.utils import load

    from cluster.speculative.rewind import rewindable

    loaded = load(model)
    draft = loaded[0]
    if not rewindable(make_prompt_cache(draft)):
        raise ValueError(
            f"--draft-model {model}: its cache cannot be rewound (sliding-window or state-space "
            "layers): pick a draft model with plain attention"
        )
    return ModelDrafter(draft)
