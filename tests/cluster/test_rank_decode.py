"""Real multi-process decoding over the ring backend equals one plain mlx-lm process."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from rankrun import Rank, Ranks, ring_jobs, run_ranks
from references import MODELS, PROMPT, Reference, reference

from cluster.load import local_files
from cluster.pipeline_stage import layer_range
from cluster.tiny_model import write_tiny_model

MAX_TOKENS, STEPS = 16, 3


@functools.cache
def expected(model_dir: Path) -> Reference:
    return reference(model_dir, PROMPT, MAX_TOKENS, STEPS)


def check_same_as_single_process(ranks: list[Rank], ref: Reference) -> dict:
    for r, rank in enumerate(ranks):
        assert rank.proc.returncode == 0, (r, rank.events[-3:], rank.stderr[-5:])
        assert rank.stderr == [], rank.stderr  # nothing but event lines on stderr
        assert rank.event("done") is not None
    result = ranks[0].event("result")
    assert result is not None and all(rank.event("result") is None for rank in ranks[1:])
    assert len(ref.tokens) >= 8  # a long enough run to mean something
    assert result["tokens"] == ref.tokens
    assert result["text"] == ref.text == ranks[0].text
    assert all(rank.text == "" for rank in ranks[1:])
    assert len(result["logits"]) == STEPS
    worst = max(
        abs(a - b)
        for got, want in zip(result["logits"], ref.logits, strict=True)
        for a, b in zip(got, want, strict=True)
    )
    assert worst < 1e-4
    # each rank's own figure, gathered intact (a collective paired with a model step's
    # all_sum in flight once delivered hidden-state bytes here)
    assert result["peak_memory_bytes"] == [
        rank.event("done")["peak_memory_bytes"] for rank in ranks
    ]
    assert all(p > 0 for p in result["peak_memory_bytes"])
    assert result["generation_tps"] > 0 and result["prompt_tps"] > 0
    assert result["drafted_tokens"] >= result["accepted_tokens"] >= 0  # the default: drafts
    return result


@pytest.mark.parametrize(("name", "n"), [("llama", 1), ("llama", 2), ("llama", 4), ("qwen3_q4", 2)])
def test_tensor_parallel_matches_single_process(
    tiny: Callable[[str], Path], name: str, n: int
) -> None:
    model = tiny(name)
    jobs = ring_jobs(
        n, model, "tensor", prompt=PROMPT, max_tokens=MAX_TOKENS, options={"return_logits": STEPS}
    )
    ranks = run_ranks(jobs)
    check_same_as_single_process(ranks, expected(model))
    for rank in ranks:  # every rank holds a slice of every layer
        assert rank.event("decode")["layers"] == [0, MODELS[name]["layers"]]


@pytest.mark.parametrize(
    ("name", "n", "split"),
    [
        ("qwen2", 2, None),  # mlx-lm's own PipelineMixin
        ("qwen2", 3, (1, 2, 3)),
        ("llama", 2, None),  # the generic stage
        ("llama", 3, (3, 2, 1)),
        ("qwen3_q4", 2, None),  # generic stage, quantized tied embeddings
    ],
)
def test_pipeline_matches_single_process(
    tiny: Callable[[str], Path], name: str, n: int, split: tuple[int, ...] | None
) -> None:
    model = tiny(name)
    jobs = ring_jobs(
        n,
        model,
        "pipeline",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        layer_split=split,
        options={"return_logits": STEPS},
    )
    ranks = run_ranks(jobs)
    check_same_as_single_process(ranks, expected(model))
    layers = [tuple(rank.event("decode")["layers"]) for rank in ranks]
    total = MODELS[name]["layers"]
    assert layers[0][1] == total and layers[-1][0] == 0  # rank 0 holds the last layers
    assert all(layers[r][0] == layers[r + 1][1] for r in range(n - 1))
    if split is not None:
        assert [b - a for a, b in layers] == list(split)
    # one file per local layer plus the embeddings/norm/head file
    assert [rank.event("decode")["files"] for rank in ranks] == [b - a + 1 for a, b in layers]


def test_pipeline_ranks_need_only_their_own_files(
    tiny: Callable[[str], Path], tmp_path: Path
) -> None:
    """Each rank gets a folder holding only its layers' safetensors: decoding still matches."""
    model = tiny("qwen2")
    jobs = ring_jobs(
        2, model, "pipeline", prompt=PROMPT, max_tokens=MAX_TOKENS, options={"return_logits": STEPS}
    )
    for r, job in enumerate(jobs):
        own = tmp_path / f"rank{r}"
        own.mkdir()
        needed = local_files(model, layer_range(6, r, 2, None))
        for item in model.iterdir():
            if not item.name.endswith(".safetensors") or item.name in needed:
                shutil.copy(item, own / item.name)
        assert len(list(own.glob("*.safetensors"))) == 4  # 3 of the 6 layer files + 1
        jobs[r] = replace(job, model=str(own))
    check_same_as_single_process(run_ranks(jobs), expected(model))


def test_missing_local_file_is_one_clear_error(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    model = tiny("llama")
    own = tmp_path / "model"
    shutil.copytree(model, own)
    (own / "model-00007-of-00007.safetensors").unlink()  # layer 5: rank 0's
    ranks = Ranks(ring_jobs(2, own, "pipeline", prompt=PROMPT, max_tokens=4))
    r0, r1 = ranks.ranks
    try:
        assert r0.proc.wait(60) == 2
    finally:  # rank 1 then fails or hangs on the lost ring: the launcher stops it; so do we
        ranks.finish(timeout=5)
    error = r0.event("error")
    assert error is not None and error["stage"] == "load"
    assert "lacks model-00007-of-00007.safetensors" in error["message"]
    assert "layers 3-5" in error["message"]
    assert r0.stderr == []  # no traceback
    assert r1.proc.returncode != 0 and r1.event("done") is None


def test_collectives_after_decoding_do_not_race_the_step_mlx_lm_ran_ahead(tmp_path: Path) -> None:
    """generate_step computes one token ahead; the gather of peak memory that follows must
    wait for it, or it pairs with that step's all_sum on the other rank (garbage numbers)."""
    model = write_tiny_model(tmp_path / "m", layers=4, hidden=256, heads=8, kv_heads=4, vocab=2048)
    for _ in range(3):  # without the wait, 5 runs in 6 went wrong here
        ranks = run_ranks(ring_jobs(2, model, "tensor", prompt="Hello", max_tokens=12))
        peaks = ranks[0].event("result")["peak_memory_bytes"]
        assert peaks == [rank.event("done")["peak_memory_bytes"] for rank in ranks]
