"""Which layers a pipeline rank holds, and which models the generic stage accepts."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from rankrun import ring_jobs, run_ranks

from cluster.pipeline_stage import check_generic, layer_range


@pytest.mark.parametrize(
    ("layers", "size", "split", "ranges"),
    [
        (6, 2, None, [(3, 6), (0, 3)]),  # rank 0 holds the LAST layers
        (7, 3, None, [(4, 7), (2, 4), (0, 2)]),  # low ranks take the extra layer
        (6, 3, (3, 2, 1), [(3, 6), (1, 3), (0, 1)]),
    ],
)
def test_layer_ranges_follow_mlx_lm(
    layers: int, size: int, split: tuple[int, ...] | None, ranges: list[tuple[int, int]]
) -> None:
    got = [layer_range(layers, r, size, split) for r in range(size)]
    assert [(g.start, g.stop) for g in got] == ranges


def _model(module: str, **extra: object) -> object:
    import importlib

    arch = importlib.import_module(f"mlx_lm.models.{module}")
    config = {
        "model_type": module,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 50,
        "head_dim": 16,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
        "rope_theta": 1e4,
    }
    return arch.Model(arch.ModelArgs.from_dict({**config, **extra}))


def test_generic_stage_takes_plain_dense_models_only() -> None:
    assert check_generic(_model("llama")) is None
    assert check_generic(_model("qwen3")) is None
    assert "family 'qwen2' has no pipeline support" in (check_generic(_model("qwen2")) or "")
    sliding = _model("llama", layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    assert "sliding-window" in (check_generic(sliding) or "")


def test_unknown_model_type_is_one_line(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    model = tmp_path / "m"
    shutil.copytree(tiny("llama"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "nosuchfamily"}))
    ranks = run_ranks(ring_jobs(1, model, prompt="hi"), timeout=60)
    errors = [e for e in ranks[0].events if e["event"] == "error"]
    assert ranks[0].proc.returncode == 2 and len(errors) == 1
    assert "Model type nosuchfamily not supported" in errors[0]["message"]
    assert ranks[0].stderr == []
