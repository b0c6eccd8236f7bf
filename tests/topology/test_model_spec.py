"""ModelSpec from real config.json files: sizes against published sizes and real safetensors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from paths import FIXTURES

from topology.errors import InputError
from topology.model.spec import ModelSpec, spec_from_config

GB = 1e9
MODELS = FIXTURES / "models"


def config(name: str) -> dict[str, Any]:
    return dict(json.loads((MODELS / name / "config.json").read_text()))


def spec(name: str) -> ModelSpec:
    return spec_from_config(config(name), source=name)


# Sizes of the mlx-community conversions as listed on the Hugging Face Hub.
@pytest.mark.parametrize(
    ("name", "published_gb"),
    [
        ("llama-3.3-70b-instruct-bf16", 141),
        ("qwen3-235b-a22b-4bit", 132),
        ("deepseek-v3-4bit", 378),
        ("qwen3-32b-8bit", 35),
    ],
)
def test_estimated_size_matches_published_conversions(name: str, published_gb: float) -> None:
    s = spec(name)
    assert s.index_total_bytes is None
    assert s.weight_bytes / GB == pytest.approx(published_gb, rel=0.02)


def test_moe_reads_only_active_experts() -> None:
    qwen = spec("qwen3-235b-a22b-4bit")
    # "A22B": about 22 B parameters active per token, at 4 bits + group scales (0.5625 B each).
    assert qwen.active_bytes_per_token / 0.5625 / GB == pytest.approx(22, rel=0.05)
    deepseek = spec("deepseek-v3-4bit")  # "37B activated"
    assert deepseek.active_bytes_per_token / 0.5625 / GB == pytest.approx(37, rel=0.05)
    assert qwen.is_moe and len(qwen.sparse_layers) == 94
    assert deepseek.sparse_layers == tuple(range(3, 61))  # first_k_dense_replace = 3


def test_dense_model_reads_everything_but_the_embedding_table() -> None:
    llama = spec("llama-3.3-70b-instruct-bf16")
    table = llama.vocab * llama.hidden * 2
    assert llama.weight_bytes - llama.active_bytes_per_token == pytest.approx(table, rel=0.001)
    assert not llama.is_moe and not llama.is_mla


def test_kv_cache_per_token() -> None:
    assert spec("llama-3.3-70b-instruct-bf16").kv_bytes_per_token == 80 * 2 * 8 * 128 * 2
    assert spec("qwen3-235b-a22b-4bit").kv_bytes_per_token == 94 * 2 * 4 * 128 * 2
    # MLA caches the 512-wide latent and the 64-wide rope key, not per-head keys and values.
    deepseek = spec("deepseek-v3-4bit")
    assert deepseek.is_mla and deepseek.kv_bytes_per_token == 61 * (512 + 64) * 2


def test_quantization_bits_scale_the_size() -> None:
    q8 = spec("qwen3-32b-8bit")
    q4 = spec_from_config(
        {**config("qwen3-32b-8bit"), "quantization": {"bits": 4, "group_size": 64}}
    )
    bf16 = {k: v for k, v in config("qwen3-32b-8bit").items() if k != "quantization"}
    full = spec_from_config(bf16)
    assert (q8.bits, q4.bits, full.bits) == (8, 4, 16)
    assert full.weight_bytes / q8.weight_bytes == pytest.approx(2 / 1.0625, rel=0.001)
    assert q8.weight_bytes / q4.weight_bytes == pytest.approx(1.0625 / 0.5625, rel=0.001)
    mx = spec_from_config({**bf16, "quantization": {"bits": 4, "group_size": 32, "mode": "mxfp4"}})
    assert full.weight_bytes / mx.weight_bytes == pytest.approx(2 / (0.5 + 1 / 32), rel=0.001)


def test_index_total_size_wins_and_parts_add_up_to_it() -> None:
    index = {"metadata": {"total_size": 100_000_000_000}, "weight_map": {}}
    s = spec_from_config(config("qwen3-32b-8bit"), index)
    assert s.weight_bytes == 100_000_000_000
    parts = sum(c.total for c in s.layer_costs()) + s.outside_layers_bytes
    assert parts == pytest.approx(100e9, rel=1e-6)


def test_qwen_moe_sparse_step_and_dense_only_layers() -> None:
    raw = {**config("qwen3-235b-a22b-4bit"), "num_hidden_layers": 8, "decoder_sparse_step": 2}
    assert spec_from_config(raw).sparse_layers == (1, 3, 5, 7)
    raw = {**raw, "decoder_sparse_step": 1, "mlp_only_layers": [0, 4]}
    assert spec_from_config(raw).sparse_layers == (1, 2, 3, 5, 6, 7)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers: missing"),
        ({"num_attention_heads": "64"}, "num_attention_heads: must be a positive integer"),
        ({"num_key_value_heads": 0}, "num_key_value_heads: must be a positive integer"),
        ({"num_key_value_heads": 7}, "num_key_value_heads: 7 does not divide 64 heads"),
        ({"model_type": None}, "model_type: missing"),
        ({"quantization": {"bits": "four"}}, "quantization: bits: must be a positive integer"),
        ({"quantization": [4]}, "quantization: must be a mapping"),
        ({"mlp_only_layers": "all"}, "mlp_only_layers: must be a list"),
    ],
)
def test_malformed_config_names_file_and_key(change: dict[str, Any], words: str) -> None:
    raw = {**config("qwen3-235b-a22b-4bit"), **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(InputError) as err:
        spec_from_config(raw, source="m/config.json")
    assert str(err.value).startswith("m/config.json: ")
    assert words in str(err.value)


def test_bad_index_total_size_names_the_index_file() -> None:
    with pytest.raises(InputError, match=r"m/model.safetensors.index.json: metadata.total_size"):
        spec_from_config(
            config("qwen3-32b-8bit"), {"metadata": {"total_size": "x"}}, "m/config.json"
        )


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from cluster.tiny_model import write_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return [
        write_tiny_model(root / "llama", family="llama"),
        write_tiny_model(root / "qwen3-q4", family="qwen3", quantize_bits=4),
        write_tiny_model(root / "qwen2-q8", family="qwen2", quantize_bits=8, group_size=64),
    ]


def test_estimate_matches_real_safetensors_written_by_mlx(tiny_models: list[Path]) -> None:
    """Real mlx-lm models (fp32, 4- and 8-bit, tied and untied heads): estimate vs bytes on disk."""
    for directory in tiny_models:
        raw = json.loads((directory / "config.json").read_text())
        estimate = spec_from_config(raw).weight_bytes
        on_disk = sum(
            len(f.read_bytes()) - _safetensors_header(f) for f in directory.glob("*.safetensors")
        )
        assert estimate == pytest.approx(on_disk, rel=0.015), directory.name


def _safetensors_header(path: Path) -> int:
    """Bytes before the tensor data: 8-byte length + the JSON header."""
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def test_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec("qwen3-32b-8bit").layers = 1  # type: ignore[misc]
