"""`mlx-cluster tiny-model`: a model mlx-lm loads, split per layer, with a working tokenizer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from paths import MLX_CLUSTER

from cluster.tiny_model import DENSE_FAMILIES, write_tiny_model

CLI = str(MLX_CLUSTER)


def tiny_model_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "tiny-model", *args], capture_output=True, text=True, timeout=120)


def greedy(model_dir: Path, prompt: str, max_tokens: int = 30) -> list[int]:
    from mlx_lm import load, stream_generate

    model, tokenizer = load(str(model_dir))[:2]
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    return [r.token for r in stream_generate(model, tokenizer, ids, max_tokens=max_tokens)]


def test_cli_writes_a_model_mlx_lm_loads(tmp_path: Path) -> None:
    from mlx_lm import load

    out = tmp_path / "m"
    done = tiny_model_cli(str(out), "--family", "qwen2", "--layers", "3", "--seed", "7")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote a tiny qwen2 model (3 layers, hidden 64) to {out}"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert set(index["weight_map"].values()) == set(files)
    for name, file in index["weight_map"].items():  # one file per layer, the rest in file 1
        layer = name.split("layers.")[1].split(".")[0] if "layers." in name else None
        assert file == files[0 if layer is None else int(layer) + 1]
    assert index["metadata"]["total_size"] > 0

    model, tokenizer = load(str(out))[:2]
    assert len(model.layers) == 3
    text = "Hello world! Ünïcode and 42 numbers\nnew line"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    config = json.loads((out / "config.json").read_text())
    assert (config["intermediate_size"], config["head_dim"]) == (128, 16)  # 2 x hidden, 64 / 4
    assert tokenizer.eos_token_ids == {config["eos_token_id"]}
    assert tokenizer.convert_ids_to_tokens(config["eos_token_id"]) == "<|im_end|>"


@pytest.mark.parametrize("family", DENSE_FAMILIES)  # the MoE ones: test_tiny_families.py
def test_greedy_decoding_varies(tmp_path: Path, family: str) -> None:
    tokens = greedy(
        write_tiny_model(tmp_path / family, family=family), "Write a poem about the sea"
    )
    assert len(tokens) >= 20 and len(set(tokens)) >= len(tokens) // 2, tokens


def test_quantized_model_records_quantization_as_mlx_lm_expects(tmp_path: Path) -> None:
    done = tiny_model_cli(str(tmp_path / "q"), "--quantize-bits", "4", "--hidden", "128")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1  # quantize_model's own print is kept quiet
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 4, "mode": "affine"}
    assert config["quantization_config"] == config["quantization"]
    index = json.loads((tmp_path / "q" / "model.safetensors.index.json").read_text())
    assert "model.layers.0.mlp.down_proj.scales" in index["weight_map"]
    tokens = greedy(tmp_path / "q", "Hello")
    assert len(set(tokens)) >= 5


def test_same_seed_same_weights_and_rewrite_in_place(tmp_path: Path) -> None:
    a = write_tiny_model(tmp_path / "a", layers=2, seed=3)
    b = write_tiny_model(tmp_path / "b", layers=2, seed=3)
    c = write_tiny_model(tmp_path / "c", layers=2, seed=4)
    name = "model-00002-of-00003.safetensors"
    assert (a / name).read_bytes() == (b / name).read_bytes() != (c / name).read_bytes()
    assert (a / "tokenizer.json").read_text() == (c / "tokenizer.json").read_text()
    write_tiny_model(a, layers=1)  # overwriting our own model leaves no stale shards
    assert sorted(p.name for p in a.glob("*.safetensors")) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heads", "5"], "--heads 5 must divide --hidden 64"),
        (["--kv-heads", "3"], "--kv-heads 3 must divide --heads 4"),
        (["--quantize-bits", "5"], "--quantize-bits must be one of 2, 3, 4, 6, 8 (got 5)"),
        (["--layers", "0"], "--layers must be at least 1"),
        (
            ["--hidden", "48", "--heads", "2", "--quantize-bits", "4", "--group-size", "32"],
            "--group-size 32 must be 32, 64 or 128 and divide --hidden",
        ),
        (["--family", "gpt2"], "Invalid value for '--family'"),
    ],
)
def test_bad_values_are_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = tiny_model_cli(str(tmp_path / "m"), *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr
    assert done.stderr.startswith("mlx-cluster: error: ")
    assert not (tmp_path / "m").exists()


def test_refuses_a_directory_that_is_not_a_tiny_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    done = tiny_model_cli(str(tmp_path))
    assert done.returncode == 2 and "is not empty and holds no tiny model" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    done = tiny_model_cli(str(tmp_path / "file"))
    assert done.returncode == 2 and "is not a directory" in done.stderr


def test_unwritable_path_is_one_line_exit_2_and_creates_nothing(tmp_path: Path) -> None:
    # Tests run as root, so chmod protects nothing: a regular file as parent cannot be written.
    (tmp_path / "file").write_text("x")
    for target in (tmp_path / "file" / "m", tmp_path / "file" / "deeper" / "m"):
        done = tiny_model_cli(str(target))
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("mlx-cluster: error: ")
        assert "Traceback" not in done.stderr and done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    assert (tmp_path / "file").read_text() == "x"


def test_a_failed_write_leaves_nothing_and_keeps_the_old_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import cluster.tiny_model as tiny
    from topology.errors import InputError

    old = write_tiny_model(tmp_path / "old", layers=1)
    before = {p.name: p.read_bytes() for p in old.iterdir()}

    def disk_full(out: Path, weights: object, layers: int) -> None:
        (out / "model-00001-of-00003.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tiny, "save_weights_by_layer", disk_full)
    with pytest.raises(InputError, match="No space left on device"):
        write_tiny_model(tmp_path / "new" / "deep" / "m", layers=2)
    with pytest.raises(InputError, match="No space left on device"):
        write_tiny_model(old, layers=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no temp dir, no parents
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
