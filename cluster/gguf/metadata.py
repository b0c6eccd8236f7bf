"""What a GGUF file says about its model, checked: a llama decoder MLX can read, or one line why.

Only llama-architecture files whose tensors MLX's loader reads (F32, F16, Q4_0, Q4_1, Q8_0) are
taken; names, shapes and types are all checked here, before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.gguf.reader import SUPPORTED_TYPES, GGUFHeader, TensorInfo
from topology.errors import InputError

ARCH = "llama"
LAYER_TENSORS = (
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm",
    "ffn_norm",
)  # fmt: skip
SUPPORTED_NAMES = ", ".join(name for name, _, _ in SUPPORTED_TYPES.values())
CONVERT_HINT = "convert the original checkpoint with mlx_lm.convert instead"


@dataclass(frozen=True)
class LlamaFacts:
    """The decoder's shape and settings, as config.json will state them."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rope_theta: float
    rms_eps: float
    tied: bool  # no output.weight: the head reuses the embeddings
    rope_scaling: float | None  # linear rope scaling factor, when the file sets one


def llama_facts(header: GGUFHeader) -> LlamaFacts:
    """The facts of a llama GGUF; InputError naming the first thing that is not one."""
    meta, path = header.metadata, header.path
    arch = meta.get("general.architecture")
    if arch != ARCH:
        raise InputError(
            f"{path}: architecture {arch!r} is not supported: import-gguf converts llama-family "
            f"GGUF files (general.architecture = llama); {CONVERT_HINT}"
        )
    if _int(meta, path, "llama.expert_count", 0, 0, 4096):
        raise InputError(f"{path}: a mixture-of-experts llama is not supported; {CONVERT_HINT}")
    hidden = _int(meta, path, "llama.embedding_length", None, 1, 1 << 20)
    heads = _int(meta, path, "llama.attention.head_count", None, 1, 1 << 14)
    kv_heads = _int(meta, path, "llama.attention.head_count_kv", heads, 1, heads)
    head_dim = _int(meta, path, "llama.attention.key_length", hidden // heads, 2, 1 << 14)
    rope_dims = _int(meta, path, "llama.rope.dimension_count", head_dim, 1, 1 << 14)
    if heads % kv_heads or head_dim % 2 or rope_dims != head_dim:
        raise InputError(
            f"{path}: {heads} heads, {kv_heads} KV heads, head size {head_dim}, {rope_dims} "
            "rotary dimensions: not a llama attention layout"
        )
    embd = header.tensors.get("token_embd.weight")
    facts = LlamaFacts(
        layers=_int(meta, path, "llama.block_count", None, 1, 1024),
        hidden=hidden,
        intermediate=_int(meta, path, "llama.feed_forward_length", None, 1, 1 << 22),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=embd.shape[0] if embd is not None and len(embd.shape) == 2 else 0,
        context=_int(meta, path, "llama.context_length", 4096, 1, 1 << 24),
        rope_theta=_float(meta, path, "llama.rope.freq_base", 10000.0),
        rms_eps=_float(meta, path, "llama.attention.layer_norm_rms_epsilon", 1e-5),
        tied="output.weight" not in header.tensors,
        rope_scaling=_rope_scaling(meta, path),
    )
    _check_tensors(header, facts)
    return facts


def expected_shapes(f: LlamaFacts) -> dict[str, tuple[int, ...]]:
    """Every tensor a llama GGUF holds, by name, with its row-major shape."""
    q, kv = f.heads * f.head_dim, f.kv_heads * f.head_dim
    layer = {
        "attn_q": (q, f.hidden), "attn_k": (kv, f.hidden), "attn_v": (kv, f.hidden),
        "attn_output": (f.hidden, q), "ffn_gate": (f.intermediate, f.hidden),
        "ffn_up": (f.intermediate, f.hidden), "ffn_down": (f.hidden, f.intermediate),
        "attn_norm": (f.hidden,), "ffn_norm": (f.hidden,),
    }  # fmt: skip
    shapes = {"token_embd.weight": (f.vocab, f.hidden), "output_norm.weight": (f.hidden,)}
    if not f.tied:
        shapes["output.weight"] = (f.vocab, f.hidden)
    for i in range(f.layers):
        shapes |= {f"blk.{i}.{name}.weight": shape for name, shape in layer.items()}
    return shapes


def _check_tensors(header: GGUFHeader, facts: LlamaFacts) -> None:
    path, tensors = header.path, header.tensors
    expected = expected_shapes(facts)
    for name, info in tensors.items():
        if name not in expected:
            why = " (llama 3.1 rope scaling)" if name == "rope_freqs.weight" else ""
            raise InputError(
                f"{path}: tensor {name}{why} is not part of a plain llama model; {CONVERT_HINT}"
            )
        _check_type(path, info)
    for name, shape in expected.items():
        if name not in tensors:
            raise InputError(f"{path}: tensor {name} is missing (an incomplete llama GGUF)")
        info = tensors[name]
        if info.shape != shape:
            raise InputError(
                f"{path}: tensor {name} has shape {list(info.shape)}, the metadata implies "
                f"{list(shape)}"
            )
        if len(shape) == 1 and info.type_id not in (0, 1):  # norms are never quantized
            raise InputError(f"{path}: tensor {name} is {info.type_name}: expected F32 or F16")


def _check_type(path: Path, info: TensorInfo) -> None:
    if info.type_id not in SUPPORTED_TYPES:
        raise InputError(
            f"{path}: tensor {info.name} is {info.type_name}, which MLX cannot read (it reads "
            f"{SUPPORTED_NAMES}): use a Q4_0, Q4_1, Q8_0 or F16 GGUF, or {CONVERT_HINT}"
        )


def _rope_scaling(meta: Any, path: Path) -> float | None:
    kind = meta.get("llama.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind != "linear":
        raise InputError(f"{path}: rope scaling {kind!r} is not supported (linear or none are)")
    factor = _float(meta, path, "llama.rope.scaling.factor", 1.0)
    return None if factor == 1.0 else factor


def _int(meta: Any, path: Path, key: str, default: int | None, low: int, high: int) -> int:
    value = meta.get(key, default)
    if value is None:
        raise InputError(f"{path}: metadata {key} is missing (is this a complete llama GGUF?)")
    if type(value) is not int or not low <= value <= high:
        raise InputError(f"{path}: metadata {key} must be a whole number {low}-{high}: {value!r}")
    return value


def _float(meta: Any, path: Path, key: str, default: float) -> float:
    value = meta.get(key, default)
    if type(value) not in (int, float) or not 0 < value < 1e12:
        raise InputError(f"{path}: metadata {key} must be a positive number, got {value!r}")
    return float(f"{value:.7g}")  # stored as float32: 1e-5 reads back as 9.9999997e-06
