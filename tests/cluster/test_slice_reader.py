"""A tensor rank reads its share of a weight from the file, not the whole weight: the slices equal
MLX's own slices of the loaded tensor, in every dtype a model ships in, and reading one costs
MLX memory for the slice alone (a lazily loaded tensor is read whole before it is sliced)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model

from cluster.slice_reader import SliceReader
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
