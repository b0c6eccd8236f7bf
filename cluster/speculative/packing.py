"""Checking forwards that multiply only the positions that hold tokens.

A check's input is rectangular: every row is padded to the longest draft, so in a batch where a
few sequences draft 8 tokens and the rest none, most positions are padding. On a host whose
forward is bound by compute (every CPU node; a Mac at many rows) the padding costs as much as
the tokens. The per-position layers (the feed-forward block, the attention's projections and the
output head, most of a step's FLOPs) do not mix positions, so while a check runs they take the
real positions out, multiply those only, and put the results back with zeros in the padding.
Attention, which does mix them, runs once per run of neighbouring rows with the same number of
real positions, over those positions only (a row that drafts nothing attends with one query, as in a
plain step). Padding comes after a row's real positions, so no real position attends to one;
its entries, written to the cache with zeros, are rewound after the check like any rejected one.

Every rank packs alike: the drafts, and so the positions, are the same on all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from cluster.attention_blocks import Sdpa, wrap_family_sdpa

FEED_FORWARD = ("mlp", "feed_forward", "block_sparse_moe")  # the families' names for it
ATTENTION = ("self_attn", "attention", "attn")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")

# While a check is built: .rows (rows, width, the real positions' flat index, each position's
# result row), .runs (neighbouring rows with as many real positions), .last (the last gather).
_current = threading.local()


def install(model: nn.Module) -> bool:
    """Make the model's per-position layers pack while `only()` is active; True when its
    feed-forward blocks and output head could be found (then a check costs its real positions),
    False when nothing was changed."""
    layers = [layer for layer in getattr(model, "layers", []) if layer is not None]
    blocks = [b for layer in layers for name in FEED_FORWARD if (b := getattr(layer, name, None))]
    head = _head(model)
    if not layers or len(blocks) != len(layers) or head is None:
        return False
    for block in blocks:
        _pack(block, "__call__")
    for layer in layers:
        for name in ATTENTION:
            attn = getattr(layer, name, None)
            if not isinstance(attn, nn.Module):
                continue
            for proj in PROJECTIONS:
                if isinstance(getattr(attn, proj, None), nn.Module):
                    _pack(getattr(attn, proj), "__call__")
            wrap_family_sdpa(attn, _by_length, "splits_rows")
    _pack(*head)
    return True


def _head(model: nn.Module) -> tuple[nn.Module, str] | None:
    """The module and method that turn hidden states into logits: `lm_head`, or the tied
    embedding's `as_linear`."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Module):
        return head, "__call__"
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if isinstance(embed, nn.Embedding | nn.QuantizedEmbedding):
        return embed, "as_linear"
    return None


def _pack(module: nn.Module, method: str) -> None:
    # A subclass, not a wrapper attribute: nn.Module keeps attributes in its parameter tree.
    if not getattr(type(module), "packs", False):
        module.__class__ = _packing(type(module), method)


@cache
def _packing(base: type, method: str) -> type:
    original = getattr(base, method)

    def call(self: Any, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        rows = getattr(_current, "rows", None)
        if rows is None or x.ndim != 3 or tuple(x.shape[:2]) != rows[:2]:
            return original(self, x, *args, **kwargs)
        batch, length, index, spread = rows
        # q, k and v read the same input: it is gathered once (each op costs ~20-50 us here).
        last = getattr(_current, "last", None)
        if last is not None and last[0] is x:
            packed = last[1]
        else:
            packed = x.reshape(batch * length, -1)[index][None]
            _current.last = (x, packed)
        y = original(self, packed, *args, **kwargs)
        # A gather from the results and one zero row, not a scatter (slower on MLX's CPU).
        return mx.pad(y[0], [(0, 1), (0, 0)])[spread].reshape(batch, length, -1)

    return type(f"Packing{base.__name__}", (base,), {method: call, "packs": True})


def _by_length(sdpa: Sdpa) -> Sdpa:
    # mlx-lm's signature: (queries, keys, values, cache, scale, mask, sinks=None); families
    # pass scale and mask by name (gpt-oss passes scale by position: it never drafts).
    def scaled_dot_product_attention(
        queries: mx.array, keys: Any, values: Any, cache: Any, *args: Any, **kw: Any
    ) -> mx.array:
        runs: list[tuple[int, int, int]] | None = getattr(_current, "runs", None)
        mask: Any = kw.get("mask")
        batch, _, length, _ = queries.shape
        if args or runs is None or (batch, length) != _current.rows[:2] or not _cuttable(mask):
            return sdpa(queries, keys, values, cache, *args, **kw)
        # Runs of neighbouring rows, sliced: a gather of rows would copy their whole cache. A
        # run's queries are its first n positions, and its keys end with the n-th (a causal
        # mask aligns the last query with the last key).
        outs: list[mx.array] = []
        for start, stop, n in runs:
            end = _length(keys) - (length - n)
            if isinstance(mask, mx.array):
                cut = (mask[start:stop] if mask.shape[0] > 1 else mask)[:, :, :n, :end]
            else:
                cut = mask
            out = sdpa(
                queries[start:stop, :, :n],
                _rows(keys, start, stop, end),
                _rows(values, start, stop, end),
                cache,
                **{**kw, "mask": cut},
            )
            if n < length:
                pad = mx.zeros((*out.shape[:2], length - n, out.shape[3]), dtype=out.dtype)
                out = mx.concatenate([out, pad], axis=2)
            outs.append(out)
        return mx.concatenate(outs) if len(outs) > 1 else outs[0]

    return scaled_dot_product_attention


def _cuttable(mask: Any) -> bool:
    """A mask that rows and queries can be cut from: a batch's array (its axes are rows, heads,
    queries, keys) or "causal"; any other (a window's, a family's own) is left whole."""
    if isinstance(mask, str):
        return mask == "causal"
    return isinstance(mask, mx.array) and mask.ndim == 4


def _length(x: Any) -> int:
    return int((x[0] if isinstance(x, tuple | list) else x).shape[2])


def _rows(x: Any, start: int, stop: int, end: int) -> Any:
    """Rows [start, stop) of a cache's keys or values (a tuple when quantized), up to entry
    `end`."""
    if isinstance(x, tuple | list):
        return type(x)(part[start:stop, :, :end] for part in x)
    return x[start:stop, :, :end]


@contextmanager
def only(lengths: Sequence[int], width: int) -> Iterator[None]:
    """While the forward of a check is built: row i's first lengths[i] of its `width`
    positions are real, the rest padding."""
    real = [i * width + j for i, n in enumerate(lengths) for j in range(n)]
    spread = [len(real)] * (len(lengths) * width)  # each position's result row (or the zeros)
    for k, p in enumerate(real):
        spread[p] = k
    _current.rows = (len(lengths), width, mx.array(real), mx.array(spread))
    _current.last = None
    runs: list[tuple[int, int, int]] = []  # (first row, row after, real positions)
    for i, n in enumerate(lengths):
        if runs and runs[-1][2] == n:
            runs[-1] = (runs[-1][0], i + 1, n)
        else:
            runs.append((i, i + 1, n))
    _current.runs = runs
    try:
        yield
    finally:
        _current.rows = _current.runs = _current.last = None
