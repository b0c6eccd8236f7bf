"""A model laid out for tensor parallel in shares, and what each rank then holds and reads.

Shares follow each rank's memory bandwidth (decoding reads every weight once a token), so every
all-reduce phase — attention, then the MLP or experts — ends at about the same time on every rank.
A rank that would not fit its memory gets a smaller share. Byte figures follow
topology/model/layout.py's estimate, scaled to the safetensors index like the rest of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from topology.model.layout import router_bits
from topology.model.spec import ModelSpec
from topology.planning.tensor_shares import WIDTHS, HeadGrid, RankShare, TensorLayout, layout

MEMORY_ROUNDS = 4  # re-balancing rounds for ranks whose share does not fit their memory
# An attention call beyond a rank's first on a layer (a share of several blocks): assumed ~1 us
# of GPU dispatch, about what a Mac reads in that time at its measured decode efficiency.
EXTRA_CALL_BYTES = 0.5e6


def _head_elements(spec: ModelSpec) -> tuple[int, int]:
    """Weights per query head (its q rows, o columns, MLA's latent maps) and per KV head."""
    h = spec.hidden
    if spec.is_mla:
        q_dim = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q_in = spec.q_lora_rank or h
        latent = (spec.kv_lora_rank or 0) * (spec.qk_nope_head_dim + spec.v_head_dim)
        return q_in * q_dim + latent + spec.v_head_dim * h, 0
    q = (3 if spec.is_hybrid else 2) * h * spec.head_dim  # Qwen3.5: a gate row per query row
    q += h if spec.head_gate else 0  # Step-3.5's g_proj: one gate row per query head
    return q, 2 * h * spec.head_dim


def _mla_whole(spec: ModelSpec, pb: float) -> float:
    """MLA's q_a and kv_a down-projections (and V3.2's indexer): whole on every rank (bytes a
    layer)."""
    if not spec.is_mla:
        return 0.0
    h, latent = spec.hidden, spec.kv_lora_rank or 0
    whole = h * (spec.q_lora_rank or 0) + h * (latent + spec.qk_rope_head_dim)
    return (whole + spec.index_weights) * pb


def _cache_per_kv(spec: ModelSpec) -> int:
    """KV cache bytes per token of context per KV head held (MLA: its whole latent cache)."""
    if spec.is_mla:  # + V3.2's indexer keys (and the zeros mlx-lm keeps as their values)
        latent = (spec.kv_lora_rank or 0) + spec.qk_rope_head_dim + spec.index_cache_dim
        return latent * spec.activation_bytes
    return 2 * spec.head_dim * spec.activation_bytes


def _score_dim(spec: ModelSpec) -> int:
    """What a query head's score and value products run over, per token of context."""
    if spec.is_mla:
        return (spec.kv_lora_rank or 0) + spec.qk_rope_head_dim
    return spec.head_dim


def grid_for(spec: ModelSpec, context: int) -> HeadGrid:
    """The attention grid with the bytes a query head and a KV head read per token. MLA's one
    "KV head" is what every rank reads whole (the latent cache, the down-projections), so
    a slower rank's share is sized with it. Step-3.5's sliding layers, when their head counts
    differ, have a grid of their own (`other`), their cache at most a window long."""
    pb = spec.param_bytes(spec.bits) * spec.scale
    q, kv = _head_elements(spec)

    def grid(heads: int, kv_heads: int, tokens: int, other: HeadGrid | None) -> HeadGrid:
        return HeadGrid(
            heads=heads,
            kv_heads=1 if spec.is_mla else kv_heads,
            out_dim=spec.v_head_dim if spec.is_mla else spec.head_dim,
            group_size=spec.group_size if spec.bits < 16 else None,
            q_cost=q * pb,
            kv_cost=kv * pb + _cache_per_kv(spec) * tokens + _mla_whole(spec, pb),
            call_cost=EXTRA_CALL_BYTES,
            other=other,
        )

    other = None
    if spec.has_other:
        window = min(context, spec.sliding_window) if spec.sliding_window else context
        other = grid(spec.other_heads, spec.other_kv_heads, window, None)
    return grid(spec.heads, spec.kv_heads, context, other)


def widths_for(spec: ModelSpec) -> dict[str, int]:
    """The widths tensor parallel splits: dense MLP, each expert, the shared expert(s)."""
    dense = len(spec.sparse_layers) < spec.layers
    widths = {"mlp": spec.intermediate if dense or not spec.is_moe else 0}
    if spec.is_moe:
        widths["expert"] = spec.moe_intermediate or spec.intermediate
        widths["shared"] = spec.shared_intermediate
    if spec.is_hybrid and spec.linear_layers:  # cut in whole key heads (linear_unit)
        widths["linear"] = spec.linear_value_heads * spec.linear_value_head_dim
    return {name: w for name, w in widths.items() if w}


def linear_unit(spec: ModelSpec) -> int:
    """The value columns a linear-attention share grows by: whole key heads, and (quantized)
    whole groups of out_proj's input columns."""
    group = spec.group_size if spec.bits < 16 and spec.group_size else 1
    return math.lcm(spec.linear_head_columns, group)


def _linear_blocker(spec: ModelSpec, n: int) -> str | None:
    """What keeps linear attention from splitting n ways, or None."""
    unit = linear_unit(spec)
    if spec.linear_value_heads * spec.linear_value_head_dim // unit >= n:
        return None
    if unit == spec.linear_head_columns:
        return f"at least {n} linear-attention key heads (the model has {spec.linear_key_heads})"
    return (
        f"linear-attention key heads in whole quantization groups of {spec.group_size} columns "
        f"({spec.linear_key_heads} heads of {spec.linear_head_columns})"
    )


def even_blocker(spec: ModelSpec, n: int) -> str | None:
    """For families only mlx-lm's even shard() splits: what does not divide by n, or None."""
    unit = spec.group_size if spec.bits < 16 and spec.group_size else 1
    counts = {"attention heads": spec.heads, **widths_for(spec)}
    if not spec.is_mla:
        counts["KV heads"] = spec.kv_heads
    for name, count in counts.items():
        if count % n or (name in WIDTHS and (count // n) % unit):
            return (
                f"{name} ({count}) split evenly {n} ways ({spec.model_type} has no uneven shards)"
            )
    return None


def tensor_layout(spec: ModelSpec, weights: Sequence[float], context: int) -> TensorLayout | str:
    """Every rank's share for these weights, or the phrase saying what cannot be split."""
    unit = spec.group_size if spec.bits < 16 and spec.group_size else 1
    widths = widths_for(spec)
    if len(weights) > 1 and not spec.uneven_supported:
        blocker = even_blocker(spec, len(weights))
        if blocker:
            return blocker
        weights = [1.0] * len(weights)
    units = dict.fromkeys(widths, unit)
    if "linear" in widths:
        units["linear"] = linear_unit(spec)
        blocker = _linear_blocker(spec, len(weights))
        if blocker:
            return blocker
    return layout(grid_for(spec, context), widths, units, weights)


@dataclass(frozen=True)
class RankCost:
    """What one rank of a layout holds and reads per token."""

    weight_bytes: float  # held: its share of every layer plus what every rank holds
    kv_cache_bytes: float  # its KV heads' cache at the context (+ its linear-attention state)
    attention_read: float  # bytes read per token in the attention phases (all layers)
    mlp_read: float  # ... in the MLP / expert phases (all layers)
    outside_read: float  # embedding row, LM head, final norm
    extra_calls: int = 0  # attention calls a token beyond one a layer (a share of several blocks)
    # floating-point operations a token (one row) in each phase (attention, MLP, outside) of
    # its weights, and in attention those of activations with activations (the scores and
    # values over the context, a linear-attention state), which run at the activations' rate
    flops: tuple[float, float, float] = (0.0, 0.0, 0.0)
    activation_flops: float = 0.0
    # elements of exp-type passes a row in each phase: softmax over its heads' scores, SiLU
    # over its MLP or experts' width (and the router's softmax)
    exp_elements: tuple[float, float, float] = (0.0, 0.0, 0.0)
    layers: int = 0  # layers it runs (every one, for tensor)

    @property
    def read_bytes(self) -> float:
        return self.attention_read + self.mlp_read + self.outside_read


def rank_costs(spec: ModelSpec, lay: TensorLayout, context: int) -> list[RankCost]:
    pb = spec.param_bytes(spec.bits) * spec.scale
    q, kv = _head_elements(spec)
    h = spec.hidden
    norms = 2 * h * spec.dtype_bytes * spec.scale
    mla_shared = _mla_whole(spec, pb)
    sparse = len(spec.sparse_layers)
    dense = spec.layers - sparse
    router = spec.experts * h * spec.param_bytes(router_bits(spec)) * spec.scale
    lin = spec.linear_layers
    # attention layers by kind: their own heads (Step-3.5's sliding ones: share.other) and the
    # tokens their caches hold (a sliding window's at most)
    kinds = [
        [i for i in range(spec.layers) if not spec.is_linear(i) and not spec.is_other(i)],
        [i for i in range(spec.layers) if spec.is_other(i)],
    ]
    tokens = [sum(spec.cached_tokens(i, context) for i in layers) for layers in kinds]
    out = []
    for share in lay.shares:
        attn_held = cache = scores = softmax = 0.0
        extra_calls = 0
        for other, layers, held_tokens in zip((False, True), kinds, tokens, strict=True):
            part = share.kind(other)
            if not layers:
                continue
            attn = part.n_heads * q * pb + part.n_kv * kv * pb + mla_shared
            attn_held += len(layers) * attn
            cache += part.n_kv * _cache_per_kv(spec) * held_tokens
            # the scores and values over the context each layer holds
            scores += 4 * part.n_heads * _score_dim(spec) * held_tokens
            softmax += part.n_heads * held_tokens
            extra_calls += (len(part.blocks) - 1) * len(layers)
        # linear attention (Qwen3.5): its key heads' weights and fixed-size state, per layer
        keys = share.width("linear") // spec.linear_head_columns if spec.is_hybrid else 0
        vectors = spec.linear_head_vectors * spec.dtype_bytes * spec.scale
        lin_w = keys * (spec.linear_head_weights * pb + vectors)
        state = keys * spec.linear_state_bytes(spec.activation_bytes)
        # the state's products: a key x value outer product and two reads a value head
        state_flops = 6 * keys * spec.linear_group * spec.linear_value_head_dim
        state_flops *= spec.linear_key_head_dim
        mlp = 3 * h * share.width("mlp") * pb
        expert = 3 * h * share.width("expert") * pb
        shared = 3 * h * share.width("shared") * pb
        held = attn_held + lin * lin_w + spec.layers * norms
        held += dense * mlp + sparse * (spec.experts * expert + shared + router)
        read_mlp = dense * mlp + sparse * (spec.experts_per_token * expert + shared + router)
        routed = spec.experts_per_token * share.width("expert") + share.width("shared")
        silu = dense * share.width("mlp") + sparse * (routed + spec.experts)
        # a multiply-add per weight read
        flops = (
            2 * (attn_held + lin * lin_w) / pb,
            2 * read_mlp / pb,
            2 * spec.outside_layers_active_bytes / pb,
        )
        out.append(
            RankCost(
                weight_bytes=held + spec.outside_layers_bytes,
                kv_cache_bytes=cache + lin * state,
                attention_read=attn_held
                + cache
                + lin * (lin_w + 2 * state)  # the state is read and written a token
                + spec.layers * norms,
                mlp_read=read_mlp,
                outside_read=spec.outside_layers_active_bytes,
                extra_calls=extra_calls,
                flops=flops,
                activation_flops=scores + lin * state_flops,
                exp_elements=(softmax, silu, 0.0),
                layers=spec.layers,
            )
        )
    return out


def phase_seconds(costs: Sequence[RankCost], bandwidths_gbs: Sequence[float]) -> list[list[float]]:
    """Per phase (attention, MLP, outside), each rank's seconds per token at full bandwidth."""
    phases = (
        [c.attention_read + c.extra_calls * EXTRA_CALL_BYTES for c in costs],
        [c.mlp_read for c in costs],
        [c.outside_read for c in costs],
    )
    return [
        [b / (bw * 1e9) for b, bw in zip(phase, bandwidths_gbs, strict=True)] for phase in phases
    ]


def balanced_layout(
    spec: ModelSpec,
    bandwidths_gbs: Sequence[float],
    usable_bytes: Sequence[int | None],
    context: int,
    needed: Callable[[RankCost], int],
) -> TensorLayout | str:
    """Shares in proportion to bandwidth; a rank over its memory gives part of its share to
    the others (a few rounds), so the plan fits where the total memory allows."""
    weights = [float(bw) for bw in bandwidths_gbs]
    lay = tensor_layout(spec, weights, context)
    for _ in range(MEMORY_ROUNDS):
        if isinstance(lay, str):
            return lay
        costs = rank_costs(spec, lay, context)
        over = [
            (i, usable / needed(c))
            for i, (c, usable) in enumerate(zip(costs, usable_bytes, strict=True))
            if usable is not None and needed(c) > usable
        ]
        if not over or len(over) == len(weights):
            return lay
        for i, ratio in over:
            weights[i] *= max(0.05, ratio * 0.97)
        lay = tensor_layout(spec, weights, context)
    return lay


def share_summary(share: RankShare, lay: TensorLayout) -> dict[str, object]:
    """What the plan shows of one rank's share."""
    other: dict[str, object] = {}
    replicated = share.replicated(lay.grid)
    if lay.grid.other is not None:  # Step-3.5's sliding layers' own heads
        mine = share.kind(True)
        other = {
            "other_heads": mine.n_heads,
            "other_kv_heads": mine.n_kv,
            "other_attention_calls": len(mine.blocks),
        }
        replicated = replicated or mine.replicated(lay.grid.other)
    return {
        "heads": share.n_heads,
        "kv_heads": share.n_kv,
        "kv_replicated": replicated,
        "attention_calls": len(share.blocks),
        **other,
        **{f"{name}_width": share.width(name) for name in share.widths},
    }
