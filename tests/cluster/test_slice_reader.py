"""A tensor rank reads its share of a weight from the file, not the whole weight: the slices equal
MLX's own slices of the loaded tensor, in every dtype a model ships in, and reading one costs
MLX memory for the slice alone (a lazily loaded tensor is read whole before it is sliced). In
every family tensor_shards cuts, each weight a share cuts is read so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from cluster.load import tensor_share
from cluster.slice_reader import SliceReader
from cluster.tensor_shards import shard_model
from cluster.tiny_model import write_tiny_model

ROOT = Path(__file__).resolve().parents[2]

SHAPES = {
    "float32": {},
    "4-bit": {"quantize_bits": 4, "group_size": 32},
    "8-bit": {"quantize_bits": 8, "group_size": 64},
}


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_slices_read_from_the_files_equal_mlx_slices(tmp_path: Path, kind: str) -> None:
    folder = write_tiny_model(tmp_path / "m", layers=2, hidden=128, heads=4, kv_heads=2,
                              **SHAPES[kind])  # fmt: skip
    net, _ = load_model(folder, lazy=True)
    reader = SliceReader(sorted(folder.glob("*.safetensors")))
    read = 0
    for i, layer in enumerate(net.model.layers):
        for path, module in (("self_attn.q_proj", layer.self_attn.q_proj),
                             ("mlp.gate_proj", layer.mlp.gate_proj)):  # fmt: skip
            for name in ("weight", "scales", "biases"):
                if name not in module:
                    continue
                whole = module[name]
                rows = [3, 0, 5, 6, 7]
                got = reader.rows(f"model.layers.{i}.{path}.{name}", whole, rows)
                assert got is not None, (path, name)
                assert got.dtype == whole.dtype and mx.array_equal(got, whole[mx.array(rows)])
                spans = [(0, 1), (2, 4)]
                cols = reader.columns(f"model.layers.{i}.{path}.{name}", whole, spans)
                assert cols is not None
                want = mx.concatenate([whole[..., a:b] for a, b in spans], axis=-1)
                assert mx.array_equal(cols, want)
                read += 1
    assert read >= 4
    # a name the files do not hold, or a parameter of another shape: the caller slices
    gate = net.model.layers[0].mlp.gate_proj["weight"]
    assert reader.rows("model.layers.0.mlp.nothing.weight", gate, [0]) is None
    assert reader.rows("model.layers.0.mlp.gate_proj.weight", gate.T, [0]) is None


def test_bfloat16_bits_come_back_as_bfloat16(tmp_path: Path) -> None:
    w = (mx.arange(64 * 32, dtype=mx.float32).reshape(64, 32) / 7).astype(mx.bfloat16)
    mx.save_safetensors(str(tmp_path / "w.safetensors"), {"w": w})
    got = SliceReader([tmp_path / "w.safetensors"]).rows("w", w, [5, 1])
    assert got is not None and got.dtype == mx.bfloat16
    assert mx.array_equal(got, w[mx.array([5, 1])])


# In a process of its own: MLX's peak memory is the whole process's, and a test worker's earlier
# tests may leave threads that allocate (a peak of 13.9 MB for an 8 MB slice was seen once).
PEAKS = """
import json, sys
import mlx.core as mx
from pathlib import Path
from cluster.slice_reader import SliceReader
n, path = 4096, sys.argv[1]
rows = list(range(0, n, 8))
lazy = mx.load(path)["w"]
reader = SliceReader([Path(path)])
mx.clear_cache()
mx.reset_peak_memory()
got = reader.rows("w", lazy, rows)
mx.eval(got)
from_file = mx.get_peak_memory()
del got
mx.clear_cache()
mx.reset_peak_memory()
mx.eval(mx.take(lazy, mx.array(rows), axis=0))
print(json.dumps([from_file, mx.get_peak_memory()]))
"""


def test_reading_an_eighth_costs_an_eighth(tmp_path: Path) -> None:
    """A 64 MB weight: an eighth of its rows read from the file takes ~8 MB of MLX memory; the
    same rows sliced from the lazily loaded tensor take all 64 MB first."""
    n = 4096
    mx.save_safetensors(str(tmp_path / "big.safetensors"),
                        {"w": mx.ones((n, n), dtype=mx.float32)})  # fmt: skip
    slice_bytes = n // 8 * n * 4
    done = subprocess.run(
        [sys.executable, "-c", PEAKS, str(tmp_path / "big.safetensors")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    from_file, from_mlx = json.loads(done.stdout)
    assert from_file < 1.5 * slice_bytes, from_file
    assert from_mlx >= n * n * 4, from_mlx  # the whole tensor, as before


# One rank's share of a 3-rank plan in each family that tensor_shards cuts; hidden 128 for
# llama's 8 heads and for 4-bit experts of 3 groups of 32 (1 a rank)
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"family": "llama", "hidden": 128, "heads": 8, "kv_heads": 4},
    "qwen3_moe": {"family": "qwen3_moe"},
    "deepseek_v3": {"family": "deepseek_v3"},
    "glm4_moe": {"family": "glm4_moe"},
    "gpt_oss": {"family": "gpt_oss"},
    "qwen3_moe 4-bit": {"family": "qwen3_moe", "hidden": 128, "moe_intermediate": 96,
                        "quantize_bits": 4, "group_size": 32},
    "deepseek_v3 4-bit": {"family": "deepseek_v3", "hidden": 128, "moe_intermediate": 96,
                          "quantize_bits": 4, "group_size": 32},
    "qwen3_5": {"family": "qwen3_5", "heads": 8, "kv_heads": 2, "linear_key_heads": 4,
                "linear_value_heads": 8},
    "qwen3_5_moe 4-bit": {"family": "qwen3_5_moe", "hidden": 256, "heads": 8, "kv_heads": 2,
                          "head_dim": 32, "linear_key_heads": 4, "linear_value_heads": 8,
                          "linear_value_head_dim": 32, "moe_intermediate": 192,
                          "quantize_bits": 4, "group_size": 64},
    "minimax": {"family": "minimax", "heads": 8, "kv_heads": 2},
    # a full-attention layer (8 / 4 heads) and a sliding one with heads of its own (12 / 4)
    "step3p5": {"family": "step3p5", "hidden": 128, "heads": 8, "kv_heads": 4,
                "other_heads": 12, "other_kv_heads": 4},
    "step3p5 4-bit": {"family": "step3p5", "hidden": 256, "heads": 8, "kv_heads": 4,
                      "other_heads": 12, "other_kv_heads": 4, "moe_intermediate": 192,
                      "quantize_bits": 4, "group_size": 64},
}  # fmt: skip
# The layers a share cuts; a summed layer's bias is not cut but zeroed off rank 0
CUT = ("q_proj", "k_proj", "v_proj", "q_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
       "embed_q", "unembed_out", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
       "out_proj", "conv1d", "g_proj")  # fmt: skip
CUT_VECTORS = (".sinks", ".dt_bias", ".A_log")  # per-head vectors: gpt-oss's, Qwen3.5's
# Norms over the whole projection (MiniMax), cut with the heads; other families' are per head
CUT_NORMS = {"minimax": ("q_norm", "k_norm")}
ZEROED = ("o_proj.bias", "down_proj.bias")
# What each family must show among the weights read, so the check above is not vacuous
SHOWN = {
    "llama": ("self_attn.k_proj.weight", "mlp.down_proj.weight"),
    "qwen3_moe": ("switch_mlp.gate_proj.weight", "switch_mlp.down_proj.weight"),
    "deepseek_v3": ("self_attn.q_b_proj.weight", "embed_q.weight", "unembed_out.weight",
                    "mlp.gate_proj.weight", "switch_mlp.up_proj.weight",
                    "shared_experts.down_proj.weight"),
    "glm4_moe": ("self_attn.v_proj.weight", "switch_mlp.down_proj.weight",
                 "shared_experts.gate_proj.weight"),
    "gpt_oss": ("self_attn.sinks", "self_attn.q_proj.bias", "experts.gate_proj.bias",
                "experts.down_proj.weight"),
    "qwen3_moe 4-bit": ("self_attn.q_proj.scales", "switch_mlp.down_proj.biases"),
    "deepseek_v3 4-bit": ("embed_q.scales", "unembed_out.biases", "switch_mlp.down_proj.scales",
                          "shared_experts.up_proj.biases"),
    "qwen3_5": ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight",
                "linear_attn.dt_bias", "linear_attn.A_log", "linear_attn.in_proj_b.weight",
                "linear_attn.out_proj.weight", "self_attn.q_proj.weight"),
    "qwen3_5_moe 4-bit": ("linear_attn.in_proj_z.scales", "linear_attn.out_proj.biases",
                          "switch_mlp.down_proj.scales", "shared_expert.up_proj.biases"),
    "minimax": ("self_attn.q_norm.weight", "self_attn.k_norm.weight",
                "switch_mlp.gate_proj.weight"),
    "step3p5": ("layers.0.self_attn.g_proj.weight", "layers.1.self_attn.g_proj.weight",
                "layers.1.self_attn.q_proj.weight", "mlp.down_proj.weight",
                "switch_mlp.up_proj.weight", "share_expert.down_proj.weight"),
    "step3p5 4-bit": ("self_attn.g_proj.scales", "layers.1.self_attn.o_proj.biases",
                      "switch_mlp.down_proj.scales", "share_expert.gate_proj.biases"),
}  # fmt: skip


class _Rank:
    """The group shard_model is given: it asks the rank only (nothing here runs a collective)."""

    def __init__(self, rank: int) -> None:
        self._rank = rank

    def rank(self) -> int:
        return self._rank


def _params(net: Any) -> dict[str, mx.array]:
    # a summed layer is wrapped (SumOut.inner): the file's name for its weights
    return {k.replace(".inner.", "."): v for k, v in tree_flatten(net.parameters())}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_weight_a_share_cuts_is_read_from_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Rank 1 of an uneven 3-rank plan: every weight its share cuts comes from the reader, none
    sliced from the loaded tensor (which MLX would read whole), and equals MLX's own slice."""
    folder = write_tiny_model(tmp_path / "m", layers=2, **FAMILIES[name])
    cfg = json.loads((folder / "config.json").read_text())
    shares = [tensor_share(cfg, r, 3, None) for r in range(3)]
    assert len({json.dumps(s.to_json()) for s, _ in shares}) == 3  # each rank its own share
    read: set[str] = set()
    refused: set[str] = set()

    def recorded(method: Callable[..., mx.array | None]) -> Callable[..., mx.array | None]:
        def call(self: SliceReader, tensor: str, *args: Any) -> mx.array | None:
            got = method(self, tensor, *args)
            (read if got is not None else refused).add(tensor)
            return got

        return call

    monkeypatch.setattr(SliceReader, "rows", recorded(SliceReader.rows))
    monkeypatch.setattr(SliceReader, "columns", recorded(SliceReader.columns))
    net, _ = load_model(folder, lazy=True)
    loaded = _params(net)
    shard_model(net, _Rank(1), *shares[1], reader=SliceReader(sorted(folder.glob("*.safetensors"))))
    got = _params(net)
    # a weight replaced by another array was cut (or zeroed): it must have been read
    replaced = {k for k, v in got.items() if v is not loaded[k]}
    cuts = CUT + CUT_NORMS.get(name, ())
    cut = {k for k in loaded if k.split(".")[-2] in cuts or k.endswith(CUT_VECTORS)}
    cut -= {k for k in cut if k.endswith(ZEROED)}
    assert refused == set()  # nothing the reader was asked for fell back to a whole read
    assert replaced - cut <= {k for k in loaded if k.endswith(ZEROED)}, sorted(replaced - cut)
    assert cut <= read, sorted(cut - read)  # sliced from a loaded tensor instead
    for want in SHOWN[name]:
        assert any(k.endswith(want) for k in read), want
    # and the slices are the ones MLX cuts from the loaded tensors
    plain, _ = load_model(folder, lazy=True)
    shard_model(plain, _Rank(1), *shares[1])
    sliced = _params(plain)
    assert sliced.keys() == got.keys()
    for k in cut:
        assert got[k].dtype == sliced[k].dtype and mx.array_equal(got[k], sliced[k]), k
