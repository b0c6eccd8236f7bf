"""Attention over a share of several blocks: one uniform GQA call per block, outputs joined.

A rank whose share is a run of heads across KV rows (topology/planning/head_tiling.py) holds,
say, 3 query heads of KV head 2, all 8 of KV heads 3 and 4, and 2 of KV head 5: no single GQA
call fits that. mlx-lm's attention layers all call their module's `scaled_dot_product_attention`,
so that name is wrapped once per family module: while a layer with blocks runs, the call is split
by block along the head axis (queries, keys, values, sinks) and the outputs concatenated in the
rank's head order. Layers without blocks go straight through.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import mlx.core as mx
import mlx.nn as nn

Sdpa = Callable[..., mx.array]
Calls = tuple[tuple[int, int], ...]  # (query heads, KV heads) of each block, in head order

_running = threading.local()  # the blocks of the layer being built on this thread, if any


def install(attn: nn.Module, calls: Sequence[tuple[int, int]]) -> None:
    """Make this attention layer run its heads as these blocks."""
    wrap_family_sdpa(attn, _split, "splits_blocks")
    # A subclass, not an attribute: nn.Module keeps attributes in its parameter tree.
    attn.__class__ = _blocked(type(attn), tuple(calls))


def wrap_family_sdpa(attn: nn.Module, wrap: Callable[[Sdpa], Sdpa], marker: str) -> None:
    """Replace the `scaled_dot_product_attention` that the family module of `attn` calls with
    wrap(it), once per marker (wrappers keep the markers of what they wrap)."""
    module = sys.modules[type(attn).__module__]
    sdpa = getattr(module, "scaled_dot_product_attention", None)
    if sdpa is None or getattr(sdpa, marker, False):
        return
    wrapped = wrap(sdpa)
    wrapped.__dict__.update(sdpa.__dict__)
    setattr(wrapped, marker, True)
    setattr(module, "scaled_dot_product_attention", wrapped)  # noqa: B010


@cache
def _blocked(base: type, calls: Calls) -> type:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        _running.calls = calls
        try:
            return base.__call__(self, *args, **kwargs)
        finally:
            _running.calls = None

    return type(f"Blocked{base.__name__}", (base,), {"__call__": __call__})


def _split(sdpa: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def scaled_dot_product_attention(
        queries: mx.array,
        keys: Any,
        values: Any,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: mx.array | None = None,
    ) -> mx.array:
        calls: Calls | None = getattr(_running, "calls", None)
        if not calls:
            return sdpa(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
        outs, q0, k0 = [], 0, 0
        for nq, nk in calls:
            outs.append(
                sdpa(
                    queries[:, q0 : q0 + nq],
                    _heads(keys, k0, nk),
                    _heads(values, k0, nk),
                    cache,
                    scale=scale,
                    mask=_heads(mask, q0, nq) if _per_head(mask, queries) else mask,
                    sinks=None if sinks is None else sinks[q0 : q0 + nq],
                )
            )
            q0, k0 = q0 + nq, k0 + nk
        return mx.concatenate(outs, axis=1)

    return scaled_dot_product_attention


def _per_head(mask: Any, queries: mx.array) -> bool:
    return isinstance(mask, mx.array) and mask.ndim == 4 and mask.shape[1] == queries.shape[1] > 1


def _heads(x: Any, start: int, count: int) -> Any:
    """KV heads [start, start + count) of a cache's keys or values (a tuple when quantized)."""
    if isinstance(x, tuple | list):
        return type(x)(part[:, start : start + count] for part in x)
    return x[:, start : start + count]
