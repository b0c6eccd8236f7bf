"""GGUF tensors as mlx-lm llama weights: renamed, Q/K rows put back in Hugging Face order,
kept quantized (with the quantization config that says how) or dequantized.

MLX's loader hands Q4_0/Q4_1/Q8_0 tensors over in its own affine layout (`X.weight` packed in
uint32, `X.scales`, `X.biases`, groups of 32 along the input dimension), so they stay as read.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import mlx.core as mx

from cluster.gguf.metadata import LlamaFacts, expected_shapes
from topology.errors import InputError

DTYPES = ("keep", "float16", "float32")
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}  # fmt: skip
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)")


@dataclass(frozen=True)
class Converted:
    weights: dict[str, mx.array]  # mlx-lm names
    quantization: dict[str, object] | None  # config.json's `quantization`, None when dense
    dtype: str  # the dense dtype: float16 or float32 (norms and unquantized weights)


def mlx_name(base: str) -> str:
    """`blk.3.attn_q` -> `model.layers.3.self_attn.q_proj`; `token_embd` -> `model.embed_tokens`."""
    if base in TOP:
        return TOP[base]
    match = _BLOCK.fullmatch(base)
    if match is None or match.group(2) not in LAYER:
        raise InputError(f"tensor {base} has no place in a llama model")
    return f"model.layers.{match.group(1)}.{LAYER[match.group(2)]}"


def unpermute(rows: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row order (rotary pairs interleaved per head) to Hugging Face's
    (halves). Rows only: a quantized weight's scales and biases go through the same."""
    out, rest = rows.shape[0], rows.shape[1:]
    grouped = rows.reshape(heads, out // heads // 2, 2, *rest)
    return grouped.swapaxes(1, 2).reshape(rows.shape)


def convert(arrays: dict[str, mx.array], facts: LlamaFacts, dtype: str) -> Converted:
    """`arrays` as mx.load read the GGUF -> mlx-lm weights: as read (keep) or all `dtype`."""
    shapes = expected_shapes(facts)
    weights: dict[str, mx.array] = {}
    modes: dict[str, tuple[int, int] | None] = {}  # module -> (group size, bits), None: dense
    for base in sorted({key.rpartition(".")[0] for key in arrays}):
        name, parts = mlx_name(base), _parts(arrays, base)
        heads = {"attn_q": facts.heads, "attn_k": facts.kv_heads}.get(base.rpartition(".")[2])
        if heads is not None:
            parts = {k: unpermute(v, heads) for k, v in parts.items()}
        mode = _mode(base, parts, shapes[f"{base}.weight"][-1]) if "scales" in parts else None
        modes[name] = mode
        if dtype != "keep":
            if mode is not None:  # in float32: float16 scales times 4-bit codes lose nothing
                scales, biases = (parts[k].astype(mx.float32) for k in ("scales", "biases"))
                parts = {"weight": mx.dequantize(parts["weight"], scales, biases, *mode)}
            parts = {k: v.astype(getattr(mx, dtype)) for k, v in parts.items()}
        weights |= {f"{name}.{suffix}": value for suffix, value in parts.items()}
    if dtype != "keep":
        return Converted(weights, None, dtype)
    # The activations' dtype: the embedding's, or its scales' when it is quantized.
    embedding = weights.get("model.embed_tokens.scales", weights["model.embed_tokens.weight"])
    kept = "float32" if embedding.dtype == mx.float32 else "float16"
    return Converted(weights, _quant_config(modes), kept)


def _parts(arrays: dict[str, mx.array], base: str) -> dict[str, mx.array]:
    prefix = base + "."
    parts = {key[len(prefix) :]: value for key, value in arrays.items() if key.startswith(prefix)}
    if set(parts) not in ({"weight"}, {"weight", "scales", "biases"}):
        raise InputError(f"MLX read {base} as {sorted(parts)}: not a weight import-gguf knows")
    return parts


def _mode(base: str, parts: dict[str, mx.array], inputs: int) -> tuple[int, int]:
    """(group size, bits) of a quantized weight with `inputs` columns, from its packed shapes."""
    bits = parts["weight"].shape[-1] * 32 // inputs
    group = inputs // parts["scales"].shape[-1]
    if bits not in (4, 8) or group != 32 or parts["biases"].shape != parts["scales"].shape:
        raise InputError(f"MLX read {base} as {bits}-bit in groups of {group}: not Q4/Q8 blocks")
    return group, bits


def _quant_config(modes: dict[str, tuple[int, int] | None]) -> dict[str, object] | None:
    """mlx-lm's `quantization`: the commonest (group, bits) as default; modules that differ
    (a Q8_0 embedding in a Q4_1 file) named with theirs, dense ones with false."""
    counts = Counter(mode for name, mode in modes.items() if mode is not None)
    if not counts:
        return None
    group, bits = counts.most_common(1)[0][0]
    config: dict[str, object] = {"group_size": group, "bits": bits}
    for name, mode in sorted(modes.items()):
        if name.endswith("norm") or name.endswith("layernorm"):
            continue
        if mode is None:
            config[name] = False
        elif mode != (group, bits):
            config[name] = {"group_size": mode[0], "bits": mode[1]}
    return config
