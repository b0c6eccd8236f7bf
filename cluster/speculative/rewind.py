"""Each sequence of a batched KV cache back to its own length after a check.

mlx-lm's BatchKVCache keeps every row ending at one shared write index (rows are left-padded),
and its `trim(n)` cuts every row alike. After a check each row keeps its own number of tokens,
so the rejected tail of a row is rewritten with the row's oldest entries and its padding grows
by as much: a copy of at most the draft length per row, not of the whole row. Attention does not
depend on the order of cached entries (their positions are in the rotary embedding already, and
the mask is causal only among the new tokens), so only reading a row out (`ordered_rows`) needs
the logical order back; `RowOrder` keeps it.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


def rewindable(caches: list[Any]) -> bool:
    """True when every layer's cache is a plain KV cache, one sequence's or a batch's (no
    sliding window, no SSM state: those cannot give back entries)."""
    return bool(caches) and all(type(c) in (KVCache, BatchKVCache) for c in caches)


class RowOrder:
    """The logical position of each cached entry of the rows that were ever rewound, relative to
    the row's first entry; rows never rewound are in order and have no entry here."""

    def __init__(self) -> None:
        self.orders: dict[int, list[int]] = {}  # uid -> logical position per physical slot

    def keep(self, uids: list[int]) -> None:
        kept = set(uids)
        self.orders = {u: o for u, o in self.orders.items() if u in kept}

    def of(self, uid: int, length: int) -> list[int] | None:
        """The row's order over `length` entries; entries appended since are in order."""
        order = self.orders.get(uid)
        if order is not None and len(order) < length:
            order.extend(range(len(order), length))
        return order

    def rotate(self, uid: int, length: int, moved: int) -> None:
        """The row's first `moved` entries now stand at its end."""
        order = self.of(uid, length) or list(range(length))
        self.orders[uid] = order[moved:] + order[:moved]


def rewind_rows(caches: list[Any], uids: list[int], junk: list[int], order: RowOrder) -> None:
    """Drop the last junk[i] entries of row i in every layer."""
    common = min(junk)
    if common:
        for c in caches:
            c.trim(common)
    extra = [j - common for j in junk]
    if not any(extra):
        return
    first = caches[0]
    end = first._idx
    padding = first.left_padding.tolist()
    moves = []  # (row, from, to, count)
    for i, e in enumerate(extra):
        if e == 0:
            continue
        valid = end - e - padding[i]
        if valid >= e:  # the oldest e entries fill the rejected tail
            moves.append((i, padding[i], end - e, e))
            order.rotate(uids[i], valid, e)
            padding[i] += e
        else:  # fewer entries than rejected ones: the whole row moves to the end, in order
            moves.append((i, padding[i], end - valid, valid))
            order.of(uids[i], valid)
            padding[i] = end - valid
    # The moved entries are copied out first: a slice assignment whose source reads the same
    # buffer cannot update it in place, and MLX would copy every layer's whole cache per move.
    pieces = [
        [(mx.contiguous(c.keys[i : i + 1, :, s : s + n, :]),
          mx.contiguous(c.values[i : i + 1, :, s : s + n, :])) for i, s, _, n in moves]
        for c in caches
    ]  # fmt: skip
    mx.eval(pieces)
    new_padding = mx.array(padding)
    for c, layer in zip(caches, pieces, strict=True):
        for (i, _, dst, n), (keys, values) in zip(moves, layer, strict=True):
            c.keys[i : i + 1, :, dst : dst + n, :] = keys
            c.values[i : i + 1, :, dst : dst + n, :] = values
        c.left_padding = new_padding
        c.offset = c._idx - new_padding


def ordered_rows(caches: list[Any], row: int, uid: int, order: RowOrder) -> list[KVCache]:
    """Row `row` as one KVCache per layer, its entries in logical order (what the prefix cache
    and a finished request keep)."""
    first = caches[0]
    padding = int(first.left_padding[row].item())
    length = first._idx - padding
    logical = order.of(uid, length)
    out = []
    if logical is None:
        return [c.extract(row) for c in caches]
    slot = [0] * length
    for physical, pos in enumerate(logical):
        slot[pos] = padding + physical
    index = mx.array(slot)
    for c in caches:
        kv = KVCache()
        kv.keys = mx.contiguous(c.keys[row : row + 1][:, :, index, :])
        kv.values = mx.contiguous(c.values[row : row + 1][:, :, index, :])
        kv.offset = length
        out.append(kv)
    return out
