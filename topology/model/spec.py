"""A model's shape from its config.json (and optional safetensors index), and what it weighs.

Sizes are estimated from the architecture the way mlx-lm lays the weights out (every Linear and
the embedding quantized when `quantization` is set; norms and DeepSeek's router kept in bf16).
When model.safetensors.index.json gives metadata.total_size, every estimate is scaled to it.
Checked against the mlx-community conversions' published sizes on the Hugging Face Hub
(tests/topology/test_model_spec.py): Llama 3.3 70B bf16 ≈ 141 GB, Qwen3 235B-A22B 4-bit
≈ 132 GB, DeepSeek V3 4-bit ≈ 378 GB, Qwen3 32B 8-bit ≈ 35 GB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from topology.errors import InputError
from topology.model.config import LIMITS, index_total, quantization, sparse_layers
from topology.model.config import config_int as _int
from topology.model.layout import LayerCost, estimate_layers
from topology.model.shape import ModelShape
from topology.untrusted import show

_MODEL_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# model_type values whose mlx-lm 0.32 model class has shard() (tensor parallel), after
# mlx-lm's MODEL_REMAPPING (mistral -> llama, kimi_k2 -> deepseek_v3, ...). Not qwen3_next:
# its class has no shard() (0.32.2), so plan says so instead of a rank failing at load.
TENSOR_FAMILIES = frozenset(
    {
        "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "deepseek_v2",
        "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "glm4_moe_lite", "gpt_oss",
        "minimax", "minimax_m2", "ministral3", "exaone_moe", "step3p5", "qwen3_5_moe",
    }
)  # fmt: skip
# Families whose layers cluster/tensor_shards.py cuts in any share; the rest of TENSOR_FAMILIES
# use mlx-lm's own shard(), which splits evenly (so the rank count must divide every width).
UNEVEN_FAMILIES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "deepseek_v3",
        "kimi_k2",
        "glm4_moe",
        "gpt_oss",
        "ministral3",
        "deepseek_v2",
        "glm4_moe_lite",
        "exaone_moe",
        "deepseek_v32",
        "qwen3_5",
        "qwen3_5_moe",  # mlx-lm's own module, its Model a qwen3_5 one
        "minimax",
        "minimax_m2",  # mlx-lm runs it as minimax
        "step3p5",  # its sliding layers' heads a second share (RankShare.other)
    }
)
# Families mlx-lm 0.32 pipelines (PipelineMixin) or cluster/pipeline_stage.py runs as stages.
PIPELINE_FAMILIES = frozenset(
    {
        "llama", "mistral", "qwen3", "qwen2", "qwen3_5", "qwen3_moe", "qwen3_next", "deepseek_v2",
        "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "glm4_moe_lite", "ministral3",
        "qwen3_5_moe",
    }
)  # fmt: skip
# mlx-lm's step3p5 defaults: experts, experts a token, sliding window
STEP3P5_EXPERTS, STEP3P5_TOP_K, STEP3P5_WINDOW = 288, 8, 512
KV_CACHE_DTYPE_BYTES = 2  # mlx-lm caches keys/values in the activation dtype (bf16/fp16)


@dataclass(frozen=True)
class ModelSpec(ModelShape):
    """A model's shape with what its weights and KV cache weigh."""

    @property
    def tensor_supported(self) -> bool:
        return self.model_type in TENSOR_FAMILIES

    @property
    def uneven_supported(self) -> bool:
        return self.model_type in UNEVEN_FAMILIES

    @property
    def pipeline_refused(self) -> bool:
        """A family mlx-lm knows but neither it nor mlx-cluster can run as pipeline stages."""
        return self.model_type in TENSOR_FAMILIES and self.model_type not in PIPELINE_FAMILIES

    @property
    def quant_label(self) -> str:
        if self.bits < 16:
            return f"{self.bits}-bit"
        return "float32" if self.dtype_bytes == 4 else "bf16"

    @cached_property
    def estimated_layers(self) -> tuple[LayerCost, ...]:
        return estimate_layers(self)

    @cached_property
    def _scale(self) -> float:
        """Index total / estimate: applied to every estimate so the parts add up to the index."""
        est = sum(c.total for c in self.estimated_layers) + self._est_outside
        return self.index_total_bytes / est if self.index_total_bytes and est else 1.0

    @cached_property
    def _est_outside(self) -> float:
        return self._est_embedding + self._est_head + self.hidden * self.dtype_bytes

    @property
    def _est_embedding(self) -> float:
        return self.vocab * self.hidden * self.param_bytes(self.bits)

    @property
    def _est_head(self) -> float:
        return 0.0 if self.tie_embeddings else self._est_embedding

    @property
    def scale(self) -> float:
        """What every estimated byte figure is multiplied by to match the index's total."""
        return self._scale

    def layer_costs(self) -> tuple[LayerCost, ...]:
        """Per-layer bytes (scaled to the index when there is one)."""
        s = self._scale
        return tuple(c.scaled(s) for c in self.estimated_layers)

    @property
    def embedding_bytes(self) -> int:
        return int(self._est_embedding * self._scale)

    @property
    def head_bytes(self) -> int:
        """The LM head (0 when tied to the embedding) plus the final norm."""
        return int((self._est_head + self.hidden * self.dtype_bytes) * self._scale)

    @property
    def outside_layers_bytes(self) -> int:
        """Embedding + head + final norm: every rank holds these, in both strategies."""
        return self.embedding_bytes + self.head_bytes

    @property
    def outside_layers_active_bytes(self) -> int:
        """Read per token outside the layers: one embedding row and the whole head."""
        row = self.hidden * self.param_bytes(self.bits) * self._scale
        head = self._est_head * self._scale if not self.tie_embeddings else self.embedding_bytes
        return int(row + head + self.hidden * self.dtype_bytes)

    @property
    def weight_bytes(self) -> int:
        """Total weights: the index's total_size when known, else the estimate."""
        if self.index_total_bytes:
            return self.index_total_bytes
        return int(sum(c.total for c in self.estimated_layers) + self._est_outside)

    @property
    def active_bytes_per_token(self) -> int:
        """Weights read to decode one token (MoE: only the routed and shared experts)."""
        return int(sum(c.active for c in self.layer_costs()) + self.outside_layers_active_bytes)

    @property
    def activation_bytes(self) -> int:
        """Bytes of an activation: keys, values, linear state and the hidden states ranks
        exchange are in the activations' dtype (a float32 model's take 4 bytes)."""
        return max(KV_CACHE_DTYPE_BYTES, self.dtype_bytes)

    @property
    def activation_dtype(self) -> str:
        """The float kind activations (and a float model's weights) are in: float32 for a
        float32 model, else bfloat16 (mlx-community's models, quantized or not)."""
        return "float32" if self.dtype_bytes == 4 else "bfloat16"

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        size = self.activation_bytes
        if self.is_mla:  # MLA caches the compressed latent and the rope key only
            # (+ V3.2's indexer keys, which mlx-lm caches beside zeros as their values)
            latent = (self.kv_lora_rank or 0) + self.qk_rope_head_dim + self.index_cache_dim
            return latent * size
        return 2 * self.kv_heads * self.head_dim * size

    def kv_bytes_per_token_at(self, layer: int) -> int:
        """KV cache bytes a token in this layer (Step-3.5's sliding layers: their own heads)."""
        if not self.is_other(layer):
            return self.kv_bytes_per_token_per_layer
        return 2 * self.other_kv_heads * self.head_dim * self.activation_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        # linear-attention layers keep a fixed-size state, no cache that grows with the context
        # (a sliding window's is counted whole: an upper bound within the window)
        return sum(
            self.kv_bytes_per_token_at(i) for i in range(self.layers) if not self.is_linear(i)
        )

    @property
    def linear_state_bytes_per_layer(self) -> int:
        """A linear-attention layer's whole state for one sequence (0 without such layers)."""
        size = self.activation_bytes
        return self.linear_key_heads * self.linear_state_bytes(size) if self.is_hybrid else 0

    def layer_cache_bytes(self, layer: int, context: int) -> int:
        """One sequence's cache in this layer at `context` tokens: its KV cache, or a
        linear-attention layer's fixed-size state."""
        if self.is_linear(layer):
            return self.linear_state_bytes_per_layer
        return self.kv_bytes_per_token_at(layer) * self.cached_tokens(layer, context)

    def cache_bytes(self, start: int, end: int, context: int) -> int:
        """One sequence's cache over layers [start, end) at `context` tokens."""
        return sum(self.layer_cache_bytes(i, context) for i in range(start, end))

    def weight_bytes_at(self, bits: int) -> int:
        """Rough total if the model were quantized to `bits` instead (for fix suggestions)."""
        return int(self.weight_bytes * self.param_bytes(bits) / self.param_bytes(self.bits))

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "model_type": self.model_type,
            "layers": self.layers,
            "quantization": self.quant_label,
            "weight_bytes": self.weight_bytes,
            "active_bytes_per_token": self.active_bytes_per_token,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "moe": self.is_moe,
            "mla": self.is_mla,
        }


def spec_from_config(
    config: Mapping[str, Any], index: Mapping[str, Any] | None = None, source: str = "config.json"
) -> ModelSpec:
    """Read a config.json dict (+ safetensors index dict); InputError on anything malformed."""
    if not isinstance(config, Mapping):
        raise InputError(f"{source}: must be a JSON object")
    text = config.get("text_config")
    if isinstance(text, Mapping):  # a multimodal checkpoint (Qwen3.5): the decoder's settings
        config = {**text, **config}  # the top level wins, as cluster/load.py reads it
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError(f"{source}: model_type: missing (is this a model's config.json?)")
    if not _MODEL_TYPE.fullmatch(model_type):
        raise InputError(f"{source}: model_type: {show(model_type)} is not a model type name")
    layers = _int(config, source, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(config, source, "hidden_size", "n_embd", "d_model")
    heads = _int(config, source, "num_attention_heads", "n_head")
    # Step-3.5 names its KV heads num_attention_groups
    kv_heads = _int(config, source, "num_key_value_heads", "num_attention_groups", default=heads)
    if heads % kv_heads:
        raise InputError(f"{source}: num_key_value_heads: {kv_heads} does not divide {heads} heads")
    step = model_type == "step3p5"
    experts = _int(
        config,
        source,
        "num_experts",
        "n_routed_experts",
        "num_local_experts",
        "moe_num_experts",
        default=STEP3P5_EXPERTS if step else 0,  # mlx-lm's default for it
    )
    bits, group, mode = quantization(config, source)
    dtype = config.get("torch_dtype", config.get("dtype"))
    tie = config.get("tie_word_embeddings", True)  # mlx-lm's default for llama/qwen2
    if tie is not None and not isinstance(tie, bool):
        raise InputError(f"{source}: tie_word_embeddings: must be true or false, got {show(tie)}")
    moe_inter = _int(config, source, "moe_intermediate_size", default=0)
    shared = _shared_experts(config, source)
    spec = ModelSpec(
        source=source,
        model_type=model_type,
        layers=layers,
        hidden=hidden,
        intermediate=_int(config, source, "intermediate_size", "ffn_dim", default=0),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=_int(config, source, "head_dim", default=hidden // heads),
        vocab=_int(config, source, "vocab_size"),
        tie_embeddings=bool(tie),
        dtype_bytes=4 if dtype == "float32" else 2,
        bits=bits,
        group_size=group,
        quant_mode=mode,
        experts=experts,
        experts_per_token=_int(
            config,
            source,
            "num_experts_per_tok",
            "num_experts_per_token",
            "moe_top_k",
            default=(STEP3P5_TOP_K if step else 1) if experts else 0,
        ),
        moe_intermediate=moe_inter,
        shared_intermediate=moe_inter * shared
        or _int(config, source, "shared_expert_intermediate_size", "share_expert_dim", default=0),
        sparse_layers=_moe_layers(config, source, layers)
        if experts and "is_moe_layer" in config
        else _step3p5_moe_layers(config, source, layers)
        if experts and step
        else sparse_layers(config, source, layers, experts),
        kv_lora_rank=_int(config, source, "kv_lora_rank", default=0) or None,
        q_lora_rank=_int(config, source, "q_lora_rank", default=0) or None,
        qk_rope_head_dim=_int(config, source, "qk_rope_head_dim", default=0),
        qk_nope_head_dim=_int(config, source, "qk_nope_head_dim", default=0),
        v_head_dim=_int(config, source, "v_head_dim", default=0),
        index_heads=_int(config, source, "index_n_heads", default=0),
        index_head_dim=_int(config, source, "index_head_dim", default=0),
        index_total_bytes=index_total(index, source),
        max_context=_int(config, source, "max_position_embeddings", default=0) or None,
        **_linear_attention(config, source),
        **(_step3p5_attention(config, source, layers, heads, kv_heads) if step else {}),
    )
    if spec.experts and spec.experts_per_token > spec.experts:
        raise InputError(
            f"{source}: num_experts_per_tok: {spec.experts_per_token} is more than the "
            f"{spec.experts} experts"
        )
    if spec.is_moe and not (spec.moe_intermediate or spec.intermediate):
        raise InputError(f"{source}: moe_intermediate_size: missing for a mixture-of-experts model")
    return spec


def _linear_attention(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Gated delta net sizes (Qwen3.5, Qwen3-Next), with mlx-lm's defaults; {} without."""
    if config.get("linear_num_key_heads") is None:
        return {}
    key_heads = _int(config, source, "linear_num_key_heads")
    value_heads = _int(config, source, "linear_num_value_heads", default=key_heads)
    if value_heads % key_heads:
        raise InputError(
            f"{source}: linear_num_value_heads: {value_heads} is not a multiple of "
            f"linear_num_key_heads {key_heads}"
        )
    return {
        "linear_key_heads": key_heads,
        "linear_value_heads": value_heads,
        "linear_key_head_dim": _int(config, source, "linear_key_head_dim", default=192),
        "linear_value_head_dim": _int(config, source, "linear_value_head_dim", default=128),
        "linear_conv_kernel": _int(config, source, "linear_conv_kernel_dim", default=4),
        "full_attention_interval": _int(config, source, "full_attention_interval", default=4),
    }


def _step3p5_moe_layers(config: Mapping[str, Any], source: str, layers: int) -> tuple[int, ...]:
    """Step-3.5's moe_layers_enum ("3,4,...": the layers with experts); mlx-lm's default
    without it: every layer but the first."""
    raw = config.get("moe_layers_enum")
    if raw is None:
        return tuple(range(1, layers))
    parts = [p.strip() for p in raw.split(",")] if isinstance(raw, str) else None
    if parts is None or not all(p.isdigit() and len(p) <= 4 for p in parts):  # layers < 1024
        raise InputError(f"{source}: moe_layers_enum: must be layer numbers joined by commas")
    moe = {int(p) for p in parts}
    return tuple(i for i in range(layers) if i in moe)


def _step3p5_attention(
    config: Mapping[str, Any], source: str, layers: int, heads: int, kv_heads: int
) -> dict[str, Any]:
    """Step-3.5's sliding layers (layer_types, else the even layers, as mlx-lm builds them),
    their window, and their own head counts (attention_other_setting) where they differ."""
    types = config.get("layer_types")
    if types is None:
        sliding = tuple(range(0, layers, 2))
    elif not isinstance(types, list) or len(types) < layers:
        raise InputError(f"{source}: layer_types: must be a list of at least {layers} names")
    else:  # beyond num_hidden_layers: the multi-token-prediction layers mlx-lm drops
        sliding = tuple(i for i in range(layers) if types[i] == "sliding_attention")
    other = config.get("attention_other_setting")
    other_heads = other_kv = 0
    if other is not None:
        where = f"{source}: attention_other_setting"
        if not isinstance(other, Mapping):
            raise InputError(f"{where}: must be an object")
        other_heads = _int(other, where, "num_attention_heads")
        other_kv = _int(other, where, "num_attention_groups")
        if other_heads % other_kv:
            raise InputError(
                f"{where}: num_attention_groups: {other_kv} does not divide {other_heads} heads"
            )
        if (other_heads, other_kv) == (heads, kv_heads):
            other_heads = other_kv = 0  # one kind of heads after all
    return {
        "sliding_layers": sliding,
        "sliding_window": _int(config, source, "sliding_window", default=STEP3P5_WINDOW),
        "other_heads": other_heads,
        "other_kv_heads": other_kv,
        "head_gate": config.get("use_head_wise_attn_gate", True) is not False,
    }


def _moe_layers(config: Mapping[str, Any], source: str, layers: int) -> tuple[int, ...]:
    """EXAONE-MoE's is_moe_layer: a flag per layer, which is what mlx-lm builds from."""
    flags = config["is_moe_layer"]
    if not isinstance(flags, list) or len(flags) != layers:
        raise InputError(f"{source}: is_moe_layer: must be a list of {layers} true/false flags")
    for i, flag in enumerate(flags):
        if not isinstance(flag, bool):
            raise InputError(
                f"{source}: is_moe_layer[{i}]: must be true or false, got {show(flag)}"
            )
    return tuple(i for i, flag in enumerate(flags) if flag)


def _shared_experts(config: Mapping[str, Any], source: str) -> int:
    """DeepSeek's n_shared_experts, or EXAONE-MoE's num_shared_experts (in the same range)."""
    if config.get("n_shared_experts") is not None or config.get("num_shared_experts") is None:
        return _int(config, source, "n_shared_experts", default=0)
    value = config["num_shared_experts"]
    lo, hi = LIMITS["n_shared_experts"]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(
            f"{source}: num_shared_experts: must be a whole number from {lo} to {hi}, "
            f"got {show(value)}"
        )
    return value
