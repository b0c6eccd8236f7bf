"""config.json's numbers, each checked against a sane range before any arithmetic.

A config.json comes from anywhere (a Hub repo, a folder someone sent). Every count and width the
planner multiplies has a range far beyond any real model yet small enough that no estimate built
from them overflows or allocates: out of range is one line naming the file, the key and the range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topology.errors import InputError
from topology.untrusted import show

_K = 1024
# key -> (lowest, highest). 0 is allowed where it means "none" (no experts, no latent attention).
LIMITS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), (1, _K)),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), (1, 128 * _K)),
    **dict.fromkeys(("intermediate_size", "ffn_dim"), (1, _K * _K)),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_key_value_heads", "num_attention_groups"),
        (1, 4 * _K),
    ),
    "head_dim": (1, 4 * _K),
    "vocab_size": (1, 8 * _K * _K),
    **dict.fromkeys(
        ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"), (0, 4 * _K)
    ),
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "moe_top_k"), (1, 4 * _K)),
    "moe_intermediate_size": (0, _K * _K),
    "n_shared_experts": (0, 256),
    **dict.fromkeys(("shared_expert_intermediate_size", "share_expert_dim"), (0, _K * _K)),
    "sliding_window": (1, 16 * _K * _K),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), (0, 64 * _K)),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), (0, 4 * _K)),
    **dict.fromkeys(("index_n_heads", "index_head_dim"), (0, 4 * _K)),
    "bits": (1, 8),  # quantized weights; unquantized models have no `quantization`
    "group_size": (1, 4 * _K),
    "max_position_embeddings": (1, 16 * _K * _K),
    "first_k_dense_replace": (0, _K),
    **dict.fromkeys(("moe_layer_freq", "decoder_sparse_step"), (1, _K)),
    **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads"), (1, 4 * _K)),
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim"), (1, 4 * _K)),
    "linear_conv_kernel_dim": (1, 64),
    "full_attention_interval": (1, _K),
}
MAX_INDEX_BYTES = 1 << 46  # 64 TiB: a safetensors index total beyond any model


def check_int(value: Any, source: str, key: str) -> int:
    """`value` as config.json's `key`: an int within LIMITS[key]."""
    lo, hi = LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        what = "a positive integer" if lo >= 1 else "a whole number"
        raise InputError(
            f"{source}: {key}: must be {what} from {lo:,} to {hi:,}, got {show(value)}"
        )
    return value


def config_int(
    config: Mapping[str, Any], source: str, *keys: str, default: int | None = None
) -> int:
    """The first of `keys` present (null counts as absent), range-checked; else `default`."""
    for key in keys:
        if config.get(key) is not None:
            return check_int(config[key], source, key)
    if default is None:
        raise InputError(f"{source}: {keys[0]}: missing (is this a model's config.json?)")
    return default


def quantization(config: Mapping[str, Any], source: str) -> tuple[int, int | None, str]:
    """(bits, group size, mode); 16 bits and no group when the model is not quantized."""
    quant = config.get("quantization")
    key = "quantization"
    if quant is None:
        qc = config.get("quantization_config")
        if isinstance(qc, Mapping) and "bits" in qc:
            quant, key = qc, "quantization_config"
    if quant is None:
        return 16, None, "affine"
    if not isinstance(quant, Mapping):
        raise InputError(f"{source}: {key}: must be a mapping with bits and group_size")
    bits = config_int(quant, f"{source}: {key}", "bits")
    group = config_int(quant, f"{source}: {key}", "group_size", default=64)
    mode = quant.get("mode", "affine")
    return bits, group, mode if isinstance(mode, str) and mode.isidentifier() else "affine"


def sparse_layers(
    config: Mapping[str, Any], source: str, layers: int, experts: int
) -> tuple[int, ...]:
    """Indices of the mixture-of-experts layers (none for a dense model)."""
    if experts == 0:
        return ()
    if "first_k_dense_replace" in config or "moe_layer_freq" in config:  # DeepSeek style
        first = config_int(config, source, "first_k_dense_replace", default=0)
        freq = config_int(config, source, "moe_layer_freq", default=1)
        return tuple(i for i in range(layers) if i >= first and i % freq == 0)
    step = config_int(config, source, "decoder_sparse_step", default=1)  # Qwen MoE style
    dense_only = config.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or len(dense_only) > layers:
        raise InputError(f"{source}: mlp_only_layers: must be a list of layer numbers")
    for i, n in enumerate(dense_only):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < layers:
            raise InputError(
                f"{source}: mlp_only_layers[{i}]: must be a layer number from 0 to {layers - 1}, "
                f"got {show(n)}"
            )
    return tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)


def index_total(index: Mapping[str, Any] | None, source: str) -> int | None:
    """metadata.total_size of the safetensors index, when there is one."""
    if index is None:
        return None
    meta = index.get("metadata") if isinstance(index, Mapping) else None
    total = meta.get("total_size") if isinstance(meta, Mapping) else None
    if total is None:
        return None
    # a float is accepted (some converters write 1.4e11), an absurd or non-finite one is not
    ok = not isinstance(total, bool) and isinstance(total, int | float)
    if not ok or not 1 <= total <= MAX_INDEX_BYTES:  # nan fails both comparisons
        where = source.replace("config.json", "model.safetensors.index.json")
        raise InputError(
            f"{where}: metadata.total_size: must be a number of bytes from 1 to "
            f"{MAX_INDEX_BYTES:,}, got {show(total)}"
        )
    return int(total)
