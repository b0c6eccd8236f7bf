"""A model's architecture as config.json gives it.

Both the per-layer estimate (layout.py) and the model's byte figures (spec.py) read
these fields, so neither of the two imports the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    source: str  # where it came from: a directory, a repo id or a file name
    model_type: str
    layers: int
    hidden: int
    intermediate: int  # dense MLP width (0 when every layer is MoE)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    dtype_bytes: int = 2  # unquantized weights: bf16/fp16 = 2, float32 = 4
    bits: int = 16  # quantization bits; 16 = not quantized (bf16)
    group_size: int | None = None
    quant_mode: str = "affine"
    # Mixture of experts (experts == 0: dense)
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0  # total width of the shared expert(s)
    sparse_layers: tuple[int, ...] = ()  # indices of the MoE layers
    # Multi-head latent attention (DeepSeek V2/V3): kv_lora_rank set
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek V3.2's indexer (every layer; whole on every rank): its heads and head size
    index_heads: int = 0
    index_head_dim: int = 0
    index_total_bytes: int | None = None  # metadata.total_size of the safetensors index
    max_context: int | None = None  # max_position_embeddings, when config.json gives it
    # Gated delta net linear attention (Qwen3.5, Qwen3-Next): linear_key_heads set. Every
    # full_attention_interval-th layer has gated full attention (its q_proj also writes a gate
    # per head), the others linear attention whose key heads each carry value_heads / key_heads
    # value heads and a fixed-size state instead of a KV cache.
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    full_attention_interval: int = 1
    # Step-3.5's two attention kinds: its sliding-window layers (`sliding_layers`) may have head
    # counts of their own (other_heads / other_kv_heads; 0: the full layers' counts) and cache
    # at most `sliding_window` tokens (mlx-lm's RotatingKVCache); head_gate: g_proj, one gate
    # logit per query head
    sliding_layers: tuple[int, ...] = ()
    sliding_window: int = 0
    other_heads: int = 0
    other_kv_heads: int = 0
    head_gate: bool = False

    @property
    def has_other(self) -> bool:
        """Do the sliding layers have head counts other than the full layers'?"""
        return self.other_heads > 0

    def is_other(self, layer: int) -> bool:
        """Is this layer of the other attention kind (its own head counts)?"""
        return self.has_other and layer in self.sliding_layers

    def heads_at(self, layer: int) -> tuple[int, int]:
        """(query heads, KV heads) of this layer's attention."""
        if self.is_other(layer):
            return self.other_heads, self.other_kv_heads
        return self.heads, self.kv_heads

    def cached_tokens(self, layer: int, context: int) -> int:
        """Tokens this layer's KV cache holds at `context`: a sliding window's at most."""
        if self.sliding_window and layer in self.sliding_layers:
            return min(context, self.sliding_window)
        return context

    @property
    def is_hybrid(self) -> bool:
        """Linear-attention layers beside full-attention ones?"""
        return self.linear_key_heads > 0

    def is_linear(self, layer: int) -> bool:
        """Is this layer linear attention (as mlx-lm's qwen3_5 / qwen3_next build it)?"""
        return self.is_hybrid and (layer + 1) % self.full_attention_interval != 0

    @property
    def linear_layers(self) -> int:
        return sum(self.is_linear(i) for i in range(self.layers))

    @property
    def attention_layers(self) -> int:
        """Layers with full attention (and a KV cache): all of them but the linear ones."""
        return self.layers - self.linear_layers

    @property
    def linear_group(self) -> int:
        """Value heads per linear key head."""
        return self.linear_value_heads // self.linear_key_heads if self.is_hybrid else 0

    @property
    def linear_head_columns(self) -> int:
        """out_proj input columns of one key head (its value heads)."""
        return self.linear_group * self.linear_value_head_dim

    @property
    def linear_head_channels(self) -> int:
        """Conv channels (and in_proj_qkv rows) of one key head: its query, key and values."""
        return 2 * self.linear_key_head_dim + self.linear_head_columns

    @property
    def linear_head_weights(self) -> int:
        """Linear weights of one key head a layer: in_proj_qkv, in_proj_z, in_proj_b/a rows
        and out_proj columns."""
        per_head = self.linear_head_channels + 2 * self.linear_head_columns + 2 * self.linear_group
        return self.hidden * per_head

    @property
    def linear_head_vectors(self) -> int:
        """Its unquantized small tensors: conv1d taps, dt_bias and A_log per value head."""
        return self.linear_conv_kernel * self.linear_head_channels + 2 * self.linear_group

    def linear_state_bytes(self, act_bytes: int) -> int:
        """One key head's state a layer: the conv window (kernel - 1 steps of its channels, in
        the activations' dtype) and the recurrent state (key x value dims per value head,
        float32 as mlx-lm keeps it)."""
        conv = (self.linear_conv_kernel - 1) * self.linear_head_channels * act_bytes
        recurrent = self.linear_group * self.linear_value_head_dim * self.linear_key_head_dim * 4
        return conv + recurrent

    @property
    def index_weights(self) -> int:
        """DeepSeek V3.2's indexer weights a layer: its query map from the query latent, its
        key map and head weights from the hidden state, and the key norm (0 without one)."""
        if not self.index_heads:
            return 0
        q_in = self.q_lora_rank or self.hidden
        q = q_in * self.index_heads * self.index_head_dim
        return q + self.hidden * (self.index_head_dim + self.index_heads) + 2 * self.index_head_dim

    @property
    def index_cache_dim(self) -> int:
        """What V3.2's indexer caches a token a layer: its key, and zeros as mlx-lm's value."""
        return 2 * self.index_head_dim if self.index_heads else 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and bool(self.sparse_layers)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def param_bytes(self, bits: int) -> float:
        """Bytes per weight at `bits` (scales + biases per group included)."""
        if bits >= 16:
            return float(self.dtype_bytes)
        group = self.group_size or 64
        # affine: a scale and a bias per group in the weights' dtype; mxfp4/nvfp4: one byte
        per_group = 2 * self.dtype_bytes if self.quant_mode == "affine" else 1
        return bits / 8 + per_group / group
