"""A check that computes only its real positions (cluster/speculative/packing.py): the same
logits where rows hold tokens as the padded forward, and the per-position layers multiply only
those positions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import BatchKVCache

from cluster.speculative import packing
from cluster.tiny_model import write_tiny_model

LEFT_PADDING = [0, 3, 0, 7, 1, 0]  # six rows with contexts of different lengths
LENGTHS = [5, 1, 1, 3, 5, 2]  # one pending token plus a draft of 0-4 tokens per row
WIDTH = 5


def _caches(model: nn.Module, context: mx.array) -> list[BatchKVCache]:
    caches = [BatchKVCache(list(LEFT_PADDING)) for _ in model.layers]
    mx.eval(model(context, cache=caches))
    return caches


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "deepseek_v3", "glm4_moe"])
def test_a_packed_check_gives_the_padded_checks_logits_where_rows_hold_tokens(
    tmp_path: Path, family: str
) -> None:
    from mlx_lm import load

    model, _ = load(str(write_tiny_model(tmp_path / family, family=family, layers=3)))
    rows = len(LENGTHS)
    context = mx.random.randint(3, 300, (rows, 12), key=mx.random.key(1))
    check = mx.random.randint(3, 300, (rows, WIDTH), key=mx.random.key(2))
    padded = model(check, cache=_caches(model, context))
    assert packing.install(model)
    packed_caches = _caches(model, context)
    with packing.only(LENGTHS, WIDTH):
        packed = model(check, cache=packed_caches)
    for i, n in enumerate(LENGTHS):
        assert mx.allclose(packed[i, :n], padded[i, :n], atol=1e-4), (family, i)
        assert (mx.argmax(packed[i, :n], -1) == mx.argmax(padded[i, :n], -1)).all()
    # outside the context the layers are the model's own
    assert mx.allclose(model(check, cache=_caches(model, context)), padded, atol=1e-5)
    assert packed_caches[0].offset.tolist() == [12 + WIDTH - p for p in LEFT_PADDING]


def test_the_feed_forward_and_head_multiply_only_the_real_positions(tmp_path: Path) -> None:
    from mlx_lm import load

    model, _ = load(str(write_tiny_model(tmp_path / "llama", family="llama", layers=2)))
    assert packing.install(model)
    seen: list[tuple[int, ...]] = []
    down = model.layers[0].mlp.down_proj
    down.__class__ = _spy(type(down), seen)
    rows = len(LENGTHS)
    context = mx.random.randint(3, 300, (rows, 12), key=mx.random.key(1))
    check = mx.random.randint(3, 300, (rows, WIDTH), key=mx.random.key(2))
    caches = _caches(model, context)
    seen.clear()
    with packing.only(LENGTHS, WIDTH):
        mx.eval(model(check, cache=caches))
    assert seen == [(1, sum(LENGTHS), model.args.intermediate_size)]  # 17 of 30 positions
    seen.clear()
    mx.eval(model(check, cache=caches))
    assert seen == [(rows, WIDTH, model.args.intermediate_size)]


def _spy(base: type, seen: list[tuple[int, ...]]) -> type:
    def call(self: Any, x: mx.array) -> mx.array:
        seen.append(tuple(x.shape))
        return base.__call__(self, x)

    return type("Spy", (base,), {"__call__": call})
