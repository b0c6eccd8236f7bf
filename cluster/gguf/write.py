"""Write the mlx-lm folder: config.json, the tokenizer files and the weights split one file per
layer (plus one for embeddings, final norm and head) with model.safetensors.index.json, as
tiny_model.py does, so a pipeline rank reads only its own layers' files.

Everything is written into a temporary directory beside the target and renamed into place: a
failure (a bad file found late, a full disk, Ctrl-C) leaves nothing behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from cluster.gguf.metadata import LlamaFacts, llama_facts
from cluster.gguf.reader import read_header
from cluster.gguf.tokenizer import TokenizerFiles, build_tokenizer, tokenizer_config_json
from cluster.gguf.weights import DTYPES, Converted, convert
from cluster.model_folder import save_weights_by_layer, write_folder
from topology.errors import InputError


@dataclass(frozen=True)
class Imported:
    directory: Path
    facts: LlamaFacts
    quantization: str  # "4-bit (some 8-bit)", "float32", ...
    files: int
    bytes: int


def import_gguf(source: Path, target: Path, dtype: str = "keep") -> Imported:
    """Convert the llama GGUF at `source` into an mlx-lm folder at `target` (absent or empty)."""
    if dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not source.exists():
        raise InputError(f"{source}: no such file: give the path of a .gguf model file")
    if not source.is_file():
        raise InputError(f"{source}: not a file: give the path of a .gguf model file")
    out = _check_target(target)
    header = read_header(source)
    facts = llama_facts(header)
    tokenizer = build_tokenizer(header.metadata, source, facts.vocab, facts.context)
    converted = convert(_load(source), facts, dtype)
    files, size = write_folder(out, lambda tmp: _write(tmp, facts, tokenizer, converted))
    return Imported(out, facts, _label(converted), files, size)


def _check_target(target: Path) -> Path:
    """Where to write: a new or empty directory (a link: what it points at), else InputError."""
    out = target.resolve() if target.is_symlink() else target
    try:
        if out.exists() and not out.is_dir():
            raise InputError(f"{out} exists and is not a directory: choose another path")
        if out.is_dir() and any(out.iterdir()):
            raise InputError(f"{out} is not empty: choose a new or empty directory")
    except OSError as e:
        raise InputError(f"{out}: cannot use the directory ({e.strerror or e})") from None
    return out


def _load(source: Path) -> dict[str, mx.array]:
    """Every tensor through MLX's GGUF loader (the header has been checked: it reads safely)."""
    try:
        arrays = mx.load(str(source), format="gguf")
    except (RuntimeError, ValueError) as e:
        raise InputError(f"{source}: MLX cannot read the tensors ({e})") from None
    assert isinstance(arrays, dict)
    return arrays


def _write(out: Path, f: LlamaFacts, tok: TokenizerFiles, conv: Converted) -> tuple[int, int]:
    """Every file of the model into `out` (empty); (safetensors files, weight bytes)."""
    (out / "tokenizer.json").write_text(tok.tokenizer_json)
    (out / "tokenizer_config.json").write_text(tokenizer_config_json(tok))
    files, size = save_weights_by_layer(out, conv.weights, f.layers)
    (out / "config.json").write_text(json.dumps(model_config(f, tok, conv), indent=2))
    return files, size


def model_config(f: LlamaFacts, tok: TokenizerFiles, conv: Converted) -> dict[str, object]:
    """config.json for mlx-lm's llama (the same keys a Hugging Face LlamaForCausalLM has)."""
    config: dict[str, object] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": f.hidden,
        "num_hidden_layers": f.layers,
        "intermediate_size": f.intermediate,
        "num_attention_heads": f.heads,
        "num_key_value_heads": f.kv_heads,
        "head_dim": f.head_dim,
        "vocab_size": f.vocab,
        "rms_norm_eps": f.rms_eps,
        "rope_theta": f.rope_theta,
        "max_position_embeddings": f.context,
        "tie_word_embeddings": f.tied,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": conv.dtype,
    }
    if f.rope_scaling is not None:
        config["rope_scaling"] = {"type": "linear", "factor": f.rope_scaling}
    if tok.bos_id is not None:
        config["bos_token_id"] = tok.bos_id
    if tok.eos_ids:
        config["eos_token_id"] = tok.eos_ids[0] if len(tok.eos_ids) == 1 else list(tok.eos_ids)
    if conv.quantization is not None:
        config["quantization"] = conv.quantization
    return config


def _label(conv: Converted) -> str:
    quant = conv.quantization
    if quant is None:
        return conv.dtype
    others = sorted({v["bits"] for v in quant.values() if isinstance(v, dict)} - {quant["bits"]})
    extra = f" (some {', '.join(f'{b}-bit' for b in others)})" if others else ""
    return f"{quant['bits']}-bit{extra}"
