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
    index_total_bytes: int | None = None  # metadata.total_size of the safetensors index
    max_context: int | None = None  # max_position_embeddings, when config.json gives it

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
