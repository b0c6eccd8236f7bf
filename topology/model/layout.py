"""Bytes of one transformer layer, split the way tensor parallelism splits them.

mlx-lm's shard() splits attention projections, dense MLPs and every expert's intermediate
dimension across ranks ("sharded"); norms, MLA's down-projections (q_a_proj, kv_a_proj) and the
MoE router stay whole on every rank ("replicated"). "Active" is what one decoded token reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.model.shape import ModelShape


@dataclass(frozen=True)
class LayerCost:
    sharded: float  # bytes split evenly across tensor-parallel ranks
    replicated: float  # bytes every tensor-parallel rank holds in full
    active_sharded: float  # of `sharded`, read per token (MoE: routed + shared experts only)
    active_replicated: float

    @property
    def total(self) -> float:
        return self.sharded + self.replicated

    @property
    def active(self) -> float:
        return self.active_sharded + self.active_replicated

    def scaled(self, s: float) -> LayerCost:
        return LayerCost(
            self.sharded * s,
            self.replicated * s,
            self.active_sharded * s,
            self.active_replicated * s,
        )

    def per_rank(self, n: int) -> float:
        return self.sharded / n + self.replicated

    def active_per_rank(self, n: int) -> float:
        return self.active_sharded / n + self.active_replicated


def _attention(spec: ModelShape, heads: int, kv_heads: int) -> tuple[float, float]:
    """(sharded, replicated) weight counts of one attention block of these head counts."""
    h = spec.hidden
    if spec.is_mla:
        rank = spec.kv_lora_rank or 0
        q_out = spec.heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim)
        if spec.q_lora_rank:
            q_sharded, q_repl = spec.q_lora_rank * q_out, h * spec.q_lora_rank + spec.q_lora_rank
        else:
            q_sharded, q_repl = h * q_out, 0
        kv_a = h * (rank + spec.qk_rope_head_dim) + rank  # + its norm
        kv_b = rank * spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        o = spec.heads * spec.v_head_dim * h
        return q_sharded + kv_b + o, q_repl + kv_a + spec.index_weights  # V3.2's indexer whole
    q = h * heads * spec.head_dim
    kv = 2 * h * kv_heads * spec.head_dim
    gate = q if spec.is_hybrid else 0  # Qwen3.5's q_proj also writes a gate per head
    gate += h * heads if spec.head_gate else 0  # Step-3.5's g_proj: a gate logit per head
    return 2 * q + gate + kv, 0


def _linear_attention(spec: ModelShape) -> tuple[float, float]:
    """(quantized, unquantized) weight counts of one gated delta net layer, all of it cut by
    key heads (its output norm, one value head wide, is negligible)."""
    return (
        spec.linear_key_heads * spec.linear_head_weights,
        spec.linear_key_heads * spec.linear_head_vectors,
    )


def router_bits(spec: ModelShape) -> int:
    """mlx-lm keeps DeepSeek's MoEGate in bf16 and quantizes Qwen's router gate to 8 bits."""
    if spec.bits >= 16 or spec.model_type.startswith(("deepseek", "kimi")):
        return 16
    return 8


def estimate_layers(spec: ModelShape) -> tuple[LayerCost, ...]:
    """Estimated bytes of every layer, in layer order."""
    qb = spec.param_bytes(spec.bits)
    norm_bytes = 2 * spec.hidden * spec.dtype_bytes  # input + post-attention RMSNorm
    attn_sharded, attn_repl = _attention(spec, spec.heads, spec.kv_heads)
    other_b = _attention(spec, spec.other_heads, spec.other_kv_heads)[0] * qb  # Step-3.5's
    attn_sharded_b = attn_sharded * qb
    lin_weights, lin_vectors = _linear_attention(spec)
    lin_b = lin_weights * qb + lin_vectors * spec.dtype_bytes
    # Small norm vectors inside MLA (q_a/kv_a layernorms) are counted as weights: negligible.
    attn_repl_b = attn_repl * qb + norm_bytes
    sparse = set(spec.sparse_layers)
    expert_width = spec.moe_intermediate or spec.intermediate
    expert_b = 3 * spec.hidden * expert_width * qb  # gate, up, down projections
    shared_b = 3 * spec.hidden * spec.shared_intermediate * qb
    router_b = spec.experts * spec.hidden * spec.param_bytes(router_bits(spec))
    dense_b = 3 * spec.hidden * spec.intermediate * qb
    costs = []
    for i in range(spec.layers):
        if i in sparse:
            mlp, mlp_active = (
                spec.experts * expert_b + shared_b,
                (spec.experts_per_token * expert_b + shared_b),
            )
            repl = attn_repl_b + router_b
        else:
            mlp, mlp_active, repl = dense_b, dense_b, attn_repl_b
        attn = lin_b if spec.is_linear(i) else other_b if spec.is_other(i) else attn_sharded_b
        costs.append(LayerCost(attn + mlp, repl, attn + mlp_active, repl))
    return tuple(costs)
