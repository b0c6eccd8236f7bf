"""Uneven tensor shares: whole units in proportion, head rectangles, and balanced plans.

Pure and fast: the splitting functions themselves, then plans for the reference models on
synthesized Macs (3 equal M3 Ultras; 2 M3 Ultras + 1 M4 Max) checked phase by phase.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import synth
from paths import FIXTURES

from topology.chips import BACKENDS
from topology.errors import InputError
from topology.model import spec as model_spec
from topology.model.spec import TENSOR_FAMILIES, UNEVEN_FAMILIES, ModelSpec, spec_from_config
from topology.planning.head_tiling import HeadGrid, run_blocks, tile_heads
from topology.planning.placement import pipeline_loads
from topology.planning.plan import Plan, plan_cluster
from topology.planning.predict import stage_read_bytes, tensor_seconds, tok_s
from topology.planning.report import plan_text
from topology.planning.serving import rank_kv_bytes_per_token
from topology.planning.tensor_costs import (
    grid_for,
    phase_seconds,
    rank_costs,
    tensor_layout,
    widths_for,
)
from topology.planning.tensor_shares import (
    MAX_BLOCKS,
    RankShare,
    TensorLayout,
    apportion,
    check_cover,
    layout,
    split_width,
)
from topology.problems import check

MODELS = (
    "llama-3.3-70b-instruct-bf16",
    "qwen3-235b-a22b-4bit",
    "deepseek-v3-4bit",
    "kimi-k2-4bit",
    "qwen3-32b-8bit",
)
ATTENTION_PHASE, MLP_PHASE = 0, 1  # phase_seconds: attention, MLP / experts, outside


def spec(name: str) -> ModelSpec:
    d = FIXTURES / "models" / name
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    return spec_from_config(json.loads((d / "config.json").read_text()), index, source=name)


# --- apportion / split_width -------------------------------------------------------------


@pytest.mark.parametrize(
    ("units", "weights", "expected"),
    [
        (6, [3, 2, 1], [3, 2, 1]),
        (10, [1, 1, 1], [4, 3, 3]),  # largest remainder; ties go to the first rank
        (193, [1, 1], [97, 96]),
        (24, [819, 546, 273], [12, 8, 4]),
        (3, [100, 1, 1], [1, 1, 1]),  # at least one each, however light
        (5, [100, 1, 1], [3, 1, 1]),
        (7, [1], [7]),
    ],
)
def test_apportion_gives_whole_units_in_proportion(
    units: int, weights: list[float], expected: list[int]
) -> None:
    assert apportion(units, weights) == expected


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("units", [9, 10, 17, 64, 193, 1000])
def test_apportion_sums_and_never_leaves_a_rank_empty(n: int, units: int) -> None:
    weights = [1.0 + (i * 7 % 5) for i in range(n)]  # uneven weights
    counts = apportion(units, weights)
    assert counts is not None and sum(counts) == units and min(counts) >= 1
    # never further than one unit (plus the one each is given) from its exact quota
    for count, w in zip(counts, weights, strict=True):
        assert abs(count - (1 + (units - n) * w / sum(weights))) < 1 + 1e-9


def test_apportion_refuses_fewer_units_than_weights() -> None:
    assert apportion(2, [1, 1, 1]) is None
    assert apportion(0, [1]) is None
    assert apportion(3, [1, 1, 1]) == [1, 1, 1]


def spans_ok(spans: Sequence[tuple[int, int]], width: int) -> bool:
    return (
        spans[0][0] == 0
        and spans[-1][1] == width
        and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    )


def test_split_width_cuts_whole_units_and_leaves_the_remainder_to_the_last_rank() -> None:
    assert split_width(12352, [1, 1], 64) == [(0, 6208), (6208, 12352)]  # 97 + 96 groups
    assert split_width(100, [1, 1, 1], 32) == [(0, 32), (32, 64), (64, 100)]  # 4 left over
    assert split_width(300, [1] * 8, 1) == [
        (0, 38), (38, 76), (76, 114), (114, 152), (152, 189), (189, 226), (226, 263), (263, 300)
    ]  # fmt: skip
    assert split_width(1536, [819, 546, 273], 64) == [(0, 768), (768, 1280), (1280, 1536)]
    assert split_width(64, [1, 1], 64) is None  # one group, two ranks
    assert split_width(63, [1], 64) is None  # not even one whole group
    assert split_width(128, [1, 1, 1], 64) is None


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(("width", "unit"), [(2048, 64), (12352, 64), (1000, 32), (301, 1)])
def test_split_width_covers_the_width_in_group_multiples(n: int, width: int, unit: int) -> None:
    spans = split_width(width, [float(i + 1) for i in range(n)], unit)
    assert spans is not None and len(spans) == n and spans_ok(spans, width)
    for start, end in spans:
        assert start % unit == 0 and end - start >= unit
    for _, end in spans[:-1]:
        assert end % unit == 0


# --- tile_heads ------------------------------------------------------------------------


def grid(heads: int, kv: int, out_dim: int = 128, group_size: int | None = None) -> HeadGrid:
    return HeadGrid(heads=heads, kv_heads=kv, out_dim=out_dim, group_size=group_size)


def shares_of(g: HeadGrid, weights: Sequence[float]) -> list[RankShare]:
    tiles = tile_heads(g, weights)
    assert tiles is not None, (g, weights)
    assert len(tiles) == len(weights)
    return [RankShare(blocks, {}) for blocks in tiles]


COMBOS = [
    (9, 3, 2), (9, 3, 3), (9, 3, 4),
    (64, 4, 3), (64, 4, 5), (64, 4, 6),
    (64, 8, 3), (64, 8, 2), (64, 8, 4), (64, 8, 8),
    (128, 1, 3),  # MLA-like: one latent "KV head" serves every query head
    (32, 32, 3),  # MHA
    (64, 64, 7),
    (40, 8, 6), (96, 8, 5), (8, 2, 8), (3, 1, 3),
]  # fmt: skip


@pytest.mark.parametrize(("heads", "kv", "n"), COMBOS)
@pytest.mark.parametrize("uneven", [False, True])
def test_tile_heads_covers_every_query_head_exactly_once(
    heads: int, kv: int, n: int, uneven: bool
) -> None:
    g = grid(heads, kv)
    weights = [3.0 - 2.0 * i / n for i in range(n)] if uneven else [1.0] * n
    shares = shares_of(g, weights)
    held = sorted(h for s in shares for h in s.heads(g))
    assert held == list(range(heads))
    for s in shares:
        assert 1 <= len(s.blocks) <= MAX_BLOCKS
        assert s.n_heads == len(s.heads(g)) and s.n_kv == len(s.kv_heads())
        # no KV head twice on one rank: each block's keys are its own
        assert len(set(s.kv_heads())) == s.n_kv
        for (r0, r1), (c0, c1) in s.blocks:
            assert 0 <= r0 < r1 <= kv and 0 <= c0 < c1 <= g.group
        # each block is one uniform GQA call: its KV heads serve the same number of its queries
        at = 0
        for nq, nk in s.calls():
            block = s.heads(g)[at : at + nq]
            per_kv = {h // g.group for h in block}
            assert len(per_kv) == nk and nq % nk == 0
            at += nq
        # the KV heads it holds are exactly those its query heads use
        assert {h // g.group for h in s.heads(g)} == set(s.kv_heads())


@pytest.mark.parametrize(("heads", "kv", "n"), [(64, 8, 3), (32, 32, 3), (64, 4, 6)])
def test_tile_heads_balances_equal_ranks(heads: int, kv: int, n: int) -> None:
    counts = [s.n_heads for s in shares_of(grid(heads, kv), [1.0] * n)]
    ideal = heads / n
    assert max(counts) <= ideal + heads / kv  # at most one KV head's queries over the ideal


def test_tile_heads_gives_the_heavier_rank_more_heads() -> None:
    counts = [s.n_heads for s in shares_of(grid(64, 8), [3.0, 2.0, 1.0])]
    assert counts[0] > counts[1] > counts[2] >= 1
    mha = [s.n_heads for s in shares_of(grid(32, 32), [3.0, 2.0, 1.0])]
    assert mha == [16, 11, 5]  # 32 x 3/6, 2/6, 1/6, rounded


def test_tile_heads_refuses_more_ranks_than_heads() -> None:
    assert tile_heads(grid(4, 4), [1.0] * 5) is None
    assert tile_heads(grid(4, 1), [1.0] * 4) is not None
    refused = layout(grid(2, 2), {}, {}, [1.0] * 3)
    assert refused == "at least 3 attention heads (the model has 2)"


def test_quantized_heads_align_to_whole_groups() -> None:
    # 16 columns a head, groups of 32: only even head indices start a group; 4 heads over 3
    # ranks always need a cut at an odd head
    narrow = grid(4, 4, out_dim=16, group_size=32)
    assert tile_heads(narrow, [1.0] * 3) is None
    assert layout(narrow, {}, {}, [1.0] * 3) == (
        "attention heads in whole quantization groups of 32 columns (4 heads of 16)"
    )
    assert tile_heads(narrow, [1.0] * 2) == [(((0, 2), (0, 1)),), (((2, 4), (0, 1)),)]
    wide = grid(4, 4, out_dim=32, group_size=32)
    shares = shares_of(wide, [1.0] * 3)
    assert sorted(h for s in shares for h in s.heads(wide)) == [0, 1, 2, 3]
    assert tile_heads(grid(4, 4, out_dim=16), [1.0] * 3) is not None  # unquantized: any cut


def test_run_blocks_are_a_rows_tail_whole_rows_and_a_rows_head() -> None:
    assert run_blocks(0, 16, 8) == (((0, 2), (0, 8)),)
    assert run_blocks(3, 6, 8) == (((0, 1), (3, 6)),)  # inside one row: one block
    assert run_blocks(21, 42, 8) == (((2, 3), (5, 8)), ((3, 5), (0, 8)), ((5, 6), (0, 2)))
    assert run_blocks(5, 10, 8) == (((0, 1), (5, 8)), ((1, 2), (0, 2)))


def test_runs_even_out_what_rectangles_cannot() -> None:
    """64 heads on 8 KV heads over 3 equal ranks: rectangles give 16 / 24 / 24 heads (24
    cannot be beaten with one rectangle each); runs across rows give 22 / 20 / 22, paying a
    replicated KV head and an extra call or two."""
    g = HeadGrid(heads=64, kv_heads=8, out_dim=128, group_size=64, q_cost=1.4, kv_cost=3.5)
    shares = shares_of(g, [1.0] * 3)
    assert [s.n_heads for s in shares] == [22, 20, 22]
    assert [len(s.blocks) for s in shares] == [2, 3, 2]
    costs = [g.cost(s.blocks) for s in shares]
    assert max(costs) <= 1.05 * sum(costs) / 3
    # an extra call that costs more than the balance saves: back to one rectangle a rank
    dear = HeadGrid(64, 8, 128, 64, q_cost=1.4, kv_cost=3.5, call_cost=10.0)
    assert [len(s.blocks) for s in shares_of(dear, [1.0] * 3)] == [1, 1, 1]
    assert sorted(s.n_heads for s in shares_of(dear, [1.0] * 3)) == [16, 24, 24]


def test_head_grid_alignment() -> None:
    g = grid(8, 2, out_dim=16, group_size=32)  # 2 KV heads x 4 query heads each
    assert g.group == 4
    assert g.aligned((0, 1), (0, 4))  # whole KV groups: heads 0..3 start at column 0
    assert g.aligned((0, 2), (0, 2))  # heads 0,1 and 4,5: runs start at columns 0 and 64
    assert not g.aligned((0, 1), (1, 3))  # head 1 starts at column 16
    assert not g.aligned((0, 2), (2, 3))  # head 2's run ends at column 48, inside a group
    assert grid(8, 2, out_dim=16).aligned((0, 1), (1, 3))  # unquantized: always


@pytest.mark.parametrize(("heads", "kv", "out_dim", "gs", "n"), [
    (64, 8, 128, 64, 3), (64, 4, 128, 64, 5), (128, 1, 128, 64, 3), (64, 8, 96, 64, 3),
    (32, 8, 64, 128, 4),
    (16, 16, 48, 32, 3),  # only even heads start a group: 4 + 6 + 6, not 5 + 5 + 6
])  # fmt: skip
def test_every_quantized_tiling_is_aligned(
    heads: int, kv: int, out_dim: int, gs: int, n: int
) -> None:
    g = grid(heads, kv, out_dim=out_dim, group_size=gs)
    shares = shares_of(g, [1.0] * n)
    for s in shares:
        # the output projection's columns of each run of consecutive heads: whole groups
        heads_held = s.heads(g)
        starts = [h for i, h in enumerate(heads_held) if i == 0 or heads_held[i - 1] != h - 1]
        ends = [h + 1 for i, h in enumerate(heads_held)
                if i == len(heads_held) - 1 or heads_held[i + 1] != h + 1]  # fmt: skip
        assert all(h * out_dim % gs == 0 for h in starts + ends), heads_held
    held = sorted(h for s in shares for h in s.heads(g))
    assert held == list(range(heads))


# --- RankShare from a job -----------------------------------------------------------------

GRID = grid(64, 8)
WIDTHS = {"mlp": 25600}
GOOD = {"attention": [[0, 3, 0, 8]], "mlp": [0, 8576]}
RUN = {"attention": [[2, 3, 5, 8], [3, 5, 0, 8], [5, 6, 0, 2]], "mlp": [0, 8576]}


def test_rank_share_reads_back_what_it_wrote() -> None:
    share = RankShare.from_json(GOOD, GRID, WIDTHS)
    assert share == RankShare((((0, 3), (0, 8)),), {"mlp": (0, 8576)})
    assert share.to_json() == GOOD
    assert share.n_heads == 24 and share.n_kv == 3 and share.width("mlp") == 8576
    assert share.width("expert") == 0
    assert not share.replicated(GRID)
    run = RankShare.from_json(RUN, GRID, WIDTHS)
    assert run.to_json() == RUN
    assert run.heads(GRID) == list(range(21, 42)) and run.kv_heads() == [2, 3, 4, 5]
    assert run.calls() == [(3, 1), (16, 2), (2, 1)] and run.replicated(GRID)


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [0, 3],
        "kv",
        {**GOOD, "attention": [[0, 9, 0, 8]]},  # beyond 8 KV heads: a plan for another model
        {**GOOD, "attention": [[3, 3, 0, 8]]},  # empty
        {**GOOD, "attention": [[4, 2, 0, 8]]},  # reversed
        {**GOOD, "attention": [[-1, 2, 0, 8]]},
        {**GOOD, "attention": [[0, 3, 0, 9]]},  # 8 query heads per KV head
        {**GOOD, "attention": [[0, 3, 0, 4], [2, 4, 4, 8]]},  # KV head 2 twice on one rank
        {**GOOD, "attention": []},
        {**GOOD, "attention": [[0, 1, 0, 8]] * 4},  # more blocks than a run can have
        {**GOOD, "attention": [0, 3, 0, 8]},
        {**GOOD, "kv": [0, 3]},  # the old form
        {**GOOD, "mlp": [0, 25601]},
        {**GOOD, "mlp": [0]},
        {**GOOD, "mlp": [0, 1, 2]},
        {**GOOD, "mlp": [0.0, 64.0]},
        {**GOOD, "mlp": [False, True]},
        {**GOOD, "mlp": ["0", "64"]},
        {**GOOD, "mlp": {"start": 0, "end": 64}},
        {"attention": [[0, 3, 0, 8]]},  # the model's MLP width is missing
        {**GOOD, "heads": [0, 24]},  # not a key of a share
    ],
)
def test_rank_share_rejects_a_bad_span(bad: Any) -> None:
    with pytest.raises(InputError, match="re-plan"):
        RankShare.from_json(bad, GRID, WIDTHS)


# --- plans ---------------------------------------------------------------------------------


def ultras3() -> synth.Cluster:
    return synth.mesh(3)


def two_ultras_and_a_max() -> synth.Cluster:
    c = synth.Cluster(
        [
            synth.SynthHost("studio-a", "m3-ultra"),
            synth.SynthHost("studio-b", "m3-ultra"),
            synth.SynthHost("max", "m4-max"),
        ]
    )
    for a, b in (("studio-a", "studio-b"), ("studio-b", "max"), ("max", "studio-a")):
        c.cable(a, b)
    return c


def plan_layout(s: ModelSpec, plan: Plan) -> TensorLayout:
    """The plan's shares, read back as a layout (checked against the model)."""
    lay = tensor_layout(s, [1.0] * plan.world_size, plan.context)
    assert isinstance(lay, TensorLayout)
    shares = tuple(RankShare.from_json(r.tensor_share, lay.grid, widths_for(s)) for r in plan.ranks)
    return TensorLayout(lay.grid, shares)


def coarsest_unit_share(s: ModelSpec, n: int) -> float:
    """One quantization group as a fraction of a rank's even share of the narrowest width."""
    unit = s.group_size if s.bits < 16 and s.group_size else 1
    return max(unit / (w / n) for w in widths_for(s).values())


@pytest.mark.parametrize("name", MODELS)
def test_three_equal_ultras_run_tensor_balanced(name: str) -> None:
    s = spec(name)
    result = check(ultras3().facts())
    plan = plan_cluster(result, s)
    pipeline = plan_cluster(result, s, strategy="pipeline")
    assert plan.ok and plan.strategy == "tensor" and plan.world_size == 3
    assert pipeline.ok and pipeline.predicted_decode_tok_s is not None
    assert plan.predicted_decode_tok_s is not None
    assert plan.predicted_decode_tok_s >= 1.5 * pipeline.predicted_decode_tok_s
    lay = plan_layout(s, plan)
    # equal Macs with room to spare: the shares are exactly the bandwidth-weighted layout
    bandwidths = [r.bandwidth_gbs for r in plan.ranks]
    again = tensor_layout(s, bandwidths, plan.context)
    assert isinstance(again, TensorLayout) and again.shares == lay.shares
    costs = rank_costs(s, lay, plan.context)
    assert [int(c.read_bytes) for c in costs] == [r.read_bytes_per_token for r in plan.ranks]
    phases = phase_seconds(costs, bandwidths)
    # The slowest rank sets the pace of every phase: within 5% of the mean (attention: runs of
    # heads across KV rows where rectangles would leave 16 / 24 / 24 heads).
    for phase in (ATTENTION_PHASE, MLP_PHASE):
        times = phases[phase]
        assert max(times) <= 1.05 * sum(times) / len(times), (name, phase, times)
    mlp = phases[MLP_PHASE]
    mean = sum(mlp) / len(mlp)
    # Every rank within 5%, or within one quantization group of the narrowest width where
    # whole groups cannot do better (DeepSeek: 2048 expert columns = 32 groups -> 11/11/10).
    slack = max(0.05, coarsest_unit_share(s, 3))
    for t in mlp:
        assert abs(t / mean - 1) <= slack, (name, mlp)
    for width in widths_for(s):
        counts = [sh.width(width) for sh in lay.shares]
        unit = s.group_size if s.bits < 16 and s.group_size else 1
        assert max(counts) - min(counts) <= unit, (name, width, counts)


def test_three_equal_ultras_mlp_phase_within_5_percent_where_groups_allow() -> None:
    """The strict form of the balance check, for the models whose widths have enough groups."""
    result = check(ultras3().facts())
    for name in MODELS:
        s = spec(name)
        if coarsest_unit_share(s, 3) > 0.05:
            continue  # DeepSeek V3's 32 expert groups: 11 vs 10 is 6% under the mean
        plan = plan_cluster(result, s)
        costs = rank_costs(s, plan_layout(s, plan), plan.context)
        mlp = phase_seconds(costs, [r.bandwidth_gbs for r in plan.ranks])[MLP_PHASE]
        mean = sum(mlp) / len(mlp)
        assert all(abs(t / mean - 1) <= 0.05 for t in mlp), (name, mlp)


@pytest.mark.parametrize("name", MODELS)
def test_a_slower_mac_gets_a_smaller_share_and_it_pays(name: str) -> None:
    s = spec(name)
    plan = plan_cluster(check(two_ultras_and_a_max().facts()), s)
    assert plan.ok and plan.strategy == "tensor", plan.reason
    by_host = {r.host: r for r in plan.ranks}
    assert by_host["max"].bandwidth_gbs < by_host["studio-a"].bandwidth_gbs
    m = by_host["max"].share_summary
    for ultra in ("studio-a", "studio-b"):
        u = by_host[ultra].share_summary
        assert m["heads"] < u["heads"], (name, m, u)
        for width in widths_for(s):
            assert m[f"{width}_width"] < u[f"{width}_width"], (name, width, m, u)
    for r in plan.ranks:
        assert r.memory_needed_bytes <= (r.memory_usable_bytes or 0)
    # the same cluster with equal shares: slower (the Max would set every phase's pace)
    equal = tensor_layout(s, [1.0, 1.0, 1.0], plan.context)
    assert isinstance(equal, TensorLayout)
    assert plan.backend is not None
    seconds, _ = tensor_seconds(
        s,
        rank_costs(s, equal, plan.context),
        [r.bandwidth_gbs for r in plan.ranks],
        BACKENDS[plan.backend],
    )
    assert plan.predicted_decode_tok_s is not None
    assert plan.predicted_decode_tok_s > tok_s(seconds), (name, plan.predicted_decode_tok_s)


def test_shares_of_the_mlp_follow_the_bandwidth_ratio() -> None:
    s = spec("llama-3.3-70b-instruct-bf16")  # bf16: any column is a cut
    plan = plan_cluster(check(two_ultras_and_a_max().facts()), s)
    widths = {r.host: r.share_summary["mlp_width"] for r in plan.ranks}
    assert sum(widths.values()) == s.intermediate
    ratio = widths["max"] / widths["studio-a"]
    assert ratio == pytest.approx(546 / 819, rel=0.01)


# --- plan.json -----------------------------------------------------------------------------


def tensor_x3() -> Plan:
    plan = plan_cluster(check(ultras3().facts()), spec("llama-3.3-70b-instruct-bf16"))
    assert plan.ok and plan.strategy == "tensor" and plan.world_size == 3
    return plan


def test_plan_json_round_trips_the_tensor_shares() -> None:
    plan = tensor_x3()
    raw = json.loads(json.dumps(plan.to_json()))
    back = Plan.from_json(raw)
    assert [r.tensor_share for r in back.ranks] == [r.tensor_share for r in plan.ranks]
    assert all(r.tensor_share for r in back.ranks)
    for r, written in zip(plan.ranks, raw["ranks"], strict=True):
        assert written["tensor_share"] == r.tensor_share
        assert {k: written[k] for k in r.share_summary} == dict(r.share_summary)
        assert written["read_bytes_per_token"] == r.read_bytes_per_token > 0
        assert written["predicted_step_s"] == r.predicted_step_s > 0
    # what a launch acts on reads back unchanged
    for a, b in zip(back.ranks, plan.ranks, strict=True):
        assert (a.rank, a.host, a.layers, a.ip, a.ssh) == (b.rank, b.host, b.layers, b.ip, b.ssh)
    assert (back.strategy, back.backend, back.model, back.context) == (
        plan.strategy,
        plan.backend,
        plan.model,
        plan.context,
    )
    # and every rank's share still fits the model it was planned for
    s = spec("llama-3.3-70b-instruct-bf16")
    assert plan_layout(s, back).shares == plan_layout(s, plan).shares


def test_plan_json_round_trips_a_tensor_plan_whole() -> None:
    plan = tensor_x3()
    raw = json.loads(json.dumps(plan.to_json()))
    assert Plan.from_json(raw).to_json() == raw
    assert Plan.from_json(raw) == plan


@pytest.mark.parametrize(
    "bad",
    [
        [0, 3],
        "kv",
        {"kv": [0, 3], "heads": [0, 24]},
        {"kv": [0]},
        {"kv": [0, 1, 2]},
        {"kv": (0, 3)},
        {"kv": [0, -1]},
        {"kv": [0, 1.5]},
        {"kv": [True, 3]},
        {"mlp": [0, 1 << 30]},
        {"mlp": "0-64"},
    ],
)
def test_plan_json_refuses_a_malformed_tensor_share(bad: Any) -> None:
    raw = json.loads(json.dumps(tensor_x3().to_json()))
    raw["ranks"][1]["tensor_share"] = bad
    with pytest.raises(ValueError, match=r"ranks\[1\]\.tensor_share"):
        Plan.from_json(raw)


# --- families cut in shares since issue 28's second step -----------------------------------

# Shapes like the published checkpoints' (DeepSeek-V2-Lite, GLM-4.7-Flash, DeepSeek-V3.2,
# Ministral 3 8B, K-EXAONE), 4-bit: none of their head counts divides by 3
_MLA_V2 = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
NEW_FAMILIES: dict[str, dict[str, Any]] = {
    "deepseek_v2": _MLA_V2
    | {"q_lora_rank": None, "qk_nope_head_dim": 128, "v_head_dim": 128, "num_attention_heads": 16}
    | {
        "num_key_value_heads": 16,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
    }
    | {"n_routed_experts": 64, "n_shared_experts": 2, "first_k_dense_replace": 1},
    "glm4_moe_lite": _MLA_V2
    | {"q_lora_rank": 768, "qk_nope_head_dim": 192, "v_head_dim": 256, "num_attention_heads": 20}
    | {
        "num_key_value_heads": 20,
        "hidden_size": 2048,
        "intermediate_size": 10240,
        "moe_intermediate_size": 1536,
    }
    | {"n_routed_experts": 64, "n_shared_experts": 1, "first_k_dense_replace": 1},
    "deepseek_v32": _MLA_V2
    | {"q_lora_rank": 1536, "qk_nope_head_dim": 128, "v_head_dim": 128, "num_attention_heads": 128}
    | {"num_key_value_heads": 128, "hidden_size": 7168, "intermediate_size": 18432}
    | {"moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1}
    | {"first_k_dense_replace": 3, "index_n_heads": 64, "index_head_dim": 128},
    "ministral3": {"hidden_size": 4096, "intermediate_size": 14336, "head_dim": 128}
    | {"num_attention_heads": 32, "num_key_value_heads": 8},
    "exaone_moe": {"hidden_size": 6144, "intermediate_size": 18432, "head_dim": 128}
    | {"num_attention_heads": 64, "num_key_value_heads": 8, "num_experts": 128}
    | {"num_shared_experts": 1, "moe_intermediate_size": 2048}
    | {"is_moe_layer": [False] + [True] * 47},
}
NEW_WIDTHS = {
    "deepseek_v2": {"mlp": 10944, "expert": 1408, "shared": 2816},
    "glm4_moe_lite": {"mlp": 10240, "expert": 1536, "shared": 1536},
    "deepseek_v32": {"mlp": 18432, "expert": 2048, "shared": 2048},
    "ministral3": {"mlp": 14336},
    "exaone_moe": {"mlp": 18432, "expert": 2048, "shared": 2048},
}


def new_family(family: str, **over: Any) -> ModelSpec:
    config = {"model_type": family, "num_hidden_layers": 48, "vocab_size": 102400}
    config |= {"num_experts_per_tok": 8, "quantization": {"bits": 4, "group_size": 64}}
    return spec_from_config(config | NEW_FAMILIES[family] | over)


@pytest.mark.parametrize("family", list(NEW_FAMILIES))
def test_new_families_split_over_ranks_that_divide_nothing(family: str) -> None:
    s = new_family(family)
    assert s.uneven_supported
    assert widths_for(s) == NEW_WIDTHS[family]
    lay = tensor_layout(s, [1.0, 1.0, 1.0], 4096)
    assert isinstance(lay, TensorLayout), lay
    heads = sorted(h for share in lay.shares for h in share.heads(lay.grid))
    assert heads == list(range(s.heads))
    assert len({share.n_heads for share in lay.shares}) > 1  # really uneven


def test_deepseek_v32s_indexer_is_counted_whole_on_every_rank_with_its_cache() -> None:
    """V3.2's indexer (every layer) is held whole by every rank, and mlx-lm caches its keys beside
    zeros as values: both count, in the weights and in the KV cache of every rank."""
    s, plain = new_family("deepseek_v32"), new_family("deepseek_v32", index_n_heads=0)
    per_layer = 1536 * 64 * 128 + 7168 * (128 + 64) + 2 * 128  # q map, key map, head weights
    assert s.index_weights == per_layer and plain.index_weights == 0
    # bf16 latent (512) + rope key (64) + the indexer's keys and zero values (2 x 128)
    assert s.kv_bytes_per_token_per_layer == (512 + 64 + 256) * 2
    assert s.kv_bytes_per_token == 48 * (512 + 64 + 256) * 2
    context = 4096
    lay, base = tensor_layout(s, [1.0] * 3, context), tensor_layout(plain, [1.0] * 3, context)
    assert isinstance(lay, TensorLayout) and isinstance(base, TensorLayout)
    pb = s.param_bytes(4) * s.scale
    for got, had in zip(rank_costs(s, lay, context), rank_costs(plain, base, context), strict=True):
        assert got.weight_bytes - had.weight_bytes == pytest.approx(48 * per_layer * pb, rel=1e-6)
        assert got.kv_cache_bytes - had.kv_cache_bytes == pytest.approx(48 * 256 * 2 * context)


def test_exaone_moe_reads_its_moe_layer_flags() -> None:
    s = new_family("exaone_moe")
    assert s.sparse_layers == tuple(range(1, 48)) and s.shared_intermediate == 2048
    with pytest.raises(InputError, match=r"is_moe_layer\[1\]: must be true or false"):
        new_family("exaone_moe", is_moe_layer=[False, 1] + [True] * 46)
    with pytest.raises(InputError, match="is_moe_layer: must be a list of 48"):
        new_family("exaone_moe", is_moe_layer=[True] * 47)


def test_a_family_on_mlx_lms_shard_still_needs_even_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor family is cut unevenly now (step3p5 was the last); the even path stays for
    a family mlx-lm adds before tensor_shards cuts it, shown here by taking step3p5 out."""
    assert TENSOR_FAMILIES <= UNEVEN_FAMILIES
    monkeypatch.setattr(model_spec, "UNEVEN_FAMILIES", UNEVEN_FAMILIES - {"step3p5"})
    config = {"model_type": "step3p5", "num_hidden_layers": 8, "vocab_size": 1000}
    config |= {"hidden_size": 2048, "num_attention_heads": 16, "num_attention_groups": 8}
    config |= {"intermediate_size": 1536, "moe_num_experts": 8, "moe_top_k": 2}
    s = spec_from_config(config)
    assert not s.uneven_supported
    assert tensor_layout(s, [1.0, 1.0, 1.0], 4096) == (
        "attention heads (16) split evenly 3 ways (step3p5 has no uneven shards)"
    )


# --- Qwen3.5: linear attention cut in whole key heads ---------------------------------------

# Shaped like Qwen3.5-35B-A3B at 4 bits, its decoder's keys nested in text_config as the
# multimodal checkpoint has them: 30 gated delta net layers (16 key heads of 2 value heads)
# and 10 gated full-attention ones (16 heads / 2 KV heads)
QWEN3_5_TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_moe_text",
    "num_hidden_layers": 40,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "vocab_size": 248320,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}


def qwen3_5(bits: int | None = 4, **text: Any) -> ModelSpec:
    config: dict[str, Any] = {"model_type": "qwen3_5_moe", "tie_word_embeddings": False}
    config["text_config"] = QWEN3_5_TEXT | text
    if bits:
        config["quantization"] = {"bits": bits, "group_size": 64}
    return spec_from_config(config)


def test_qwen3_5_reads_its_layers_from_text_config() -> None:
    s = qwen3_5()
    assert s.uneven_supported and s.is_hybrid
    assert (s.layers, s.linear_layers, s.attention_layers) == (40, 30, 10)
    assert [i for i in range(8) if not s.is_linear(i)] == [3, 7]
    # a KV cache on the full-attention layers only; a fixed state on the linear ones
    assert s.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2
    conv, recurrent = 3 * (2 * 128 + 2 * 128) * 2, 2 * 128 * 128 * 4  # per key head
    assert s.linear_state_bytes_per_layer == 16 * (conv + recurrent)
    assert widths_for(s) == {"expert": 512, "shared": 512, "linear": 32 * 128}


@pytest.mark.parametrize(
    ("weights", "keys"), [([1.0] * 3, [6, 5, 5]), ([3.0, 1.0], [12, 4]), ([1.0] * 8, [2] * 8)]
)
def test_qwen3_5_linear_key_heads_follow_the_weights(weights: list[float], keys: list[int]) -> None:
    s = qwen3_5()
    lay = tensor_layout(s, weights, 4096)
    assert isinstance(lay, TensorLayout), lay
    spans = [share.widths["linear"] for share in lay.shares]
    assert [(b - a) // 256 for a, b in spans] == keys  # 2 value heads of 128 columns a key head
    assert all(a % 256 == 0 for a, _ in spans)
    assert spans[0][0] == 0 and spans[-1][1] == 4096
    assert all(x[1] == y[0] for x, y in itertools.pairwise(spans))


def test_qwen3_5_rank_memory_counts_its_own_linear_state() -> None:
    s = qwen3_5()
    context = 8192
    lay = tensor_layout(s, [3.0, 1.0], context)
    assert isinstance(lay, TensorLayout), lay
    costs = rank_costs(s, lay, context)
    conv, recurrent = 3 * (2 * 128 + 2 * 128) * 2, 2 * 128 * 128 * 4
    kv_per_head = 2 * 256 * 2 * context  # keys and values, bf16, a full-attention layer
    for share, cost in zip(lay.shares, costs, strict=True):
        keys = share.width("linear") // 256
        want = share.n_kv * kv_per_head * 10 + keys * (conv + recurrent) * 30
        assert cost.kv_cache_bytes == pytest.approx(want)
    # each key head's state is held once (no replicas): the ranks' states add up to the model's
    held = sum(c.kv_cache_bytes for c in costs) - sum(
        sh.n_kv * kv_per_head * 10 for sh in lay.shares
    )
    assert held == pytest.approx(30 * s.linear_state_bytes_per_layer)
    # the heavier rank holds and reads more of the linear layers too
    assert costs[0].weight_bytes > costs[1].weight_bytes
    assert costs[0].attention_read > costs[1].attention_read


@pytest.mark.parametrize(
    ("text", "n", "says"),
    [
        ({}, 17, "at least 17 linear-attention key heads (the model has 16)"),
        # 64-column groups over key heads of 32 value columns: pairs of key heads, 8 of them
        (
            {"linear_num_value_heads": 16, "linear_value_head_dim": 32, "num_attention_heads": 32},
            9,
            "linear-attention key heads in whole quantization groups of 64 columns "
            "(16 heads of 32)",
        ),
    ],
)
def test_qwen3_5_linear_heads_that_cannot_split_say_so_in_one_line(
    text: dict[str, Any], n: int, says: str
) -> None:
    lay = tensor_layout(qwen3_5(**text), [1.0] * n, 4096)
    assert lay == says


def test_qwen3_5_plans_tensor_over_three_ultras_and_round_trips() -> None:
    s = qwen3_5()
    plan = plan_cluster(check(ultras3().facts()), s, strategy="tensor")
    assert plan.ok and plan.strategy == "tensor" and plan.world_size == 3, plan
    raw = json.loads(json.dumps(plan.to_json()))
    keys = [r["linear_width"] // 256 for r in raw["ranks"]]
    assert sum(keys) == 16 and max(keys) - min(keys) <= 1
    assert all("linear" in r["tensor_share"] for r in raw["ranks"])
    assert Plan.from_json(raw).to_json() == raw


def test_qwen3_5_pipeline_stages_count_a_kv_cache_only_where_layers_have_one() -> None:
    """A pipeline stage holds a KV cache for its full-attention layers and a fixed state for its
    linear ones; the prefix cache's bytes per token count only the former."""
    s = qwen3_5()
    context = 8192
    loads = pipeline_loads(s, [20, 20], context)  # rank 0: layers 20-39, rank 1: 0-19
    kv_layer, state = 2 * 2 * 256 * 2 * context, s.linear_state_bytes_per_layer
    assert [load.kv_cache_bytes for load in loads] == [5 * kv_layer + 15 * state] * 2
    assert (
        sum(load.kv_cache_bytes for load in loads) < s.kv_bytes_per_token_per_layer * 40 * context
    )
    # a stage's reads a token: its active weights, its KV over the context, its states twice
    weights = sum(c.active for c in s.layer_costs()[0:20])
    assert stage_read_bytes(s, (0, 20), context) == weights + 5 * kv_layer + 30 * state
    plan = plan_cluster(check(ultras3().facts()), s, strategy="pipeline")
    assert plan.ok, plan
    per_token = [rank_kv_bytes_per_token(plan, r, s) for r in plan.ranks]
    attention = [sum(not s.is_linear(i) for i in range(*r.layers)) for r in plan.ranks]
    assert per_token == [n * s.kv_bytes_per_token_per_layer for n in attention]


def test_minimax_m2_splits_over_ranks_that_divide_nothing() -> None:
    """MiniMax-M2's shape (48 heads / 8 KV heads, experts only): its whole-width q/k norms are
    cut with the heads (cluster/tensor_shards.py), so any rank count the heads allow."""
    config = {"model_type": "minimax_m2", "num_hidden_layers": 62, "vocab_size": 200064}
    config |= {"hidden_size": 3072, "num_attention_heads": 48, "num_key_value_heads": 8}
    config |= {"head_dim": 128, "intermediate_size": 1536, "shared_intermediate_size": 0}
    config |= {"num_local_experts": 256, "num_experts_per_tok": 8}
    config |= {"quantization": {"bits": 4, "group_size": 64}}
    s = spec_from_config(config)
    assert s.uneven_supported and widths_for(s) == {"expert": 1536}
    lay = tensor_layout(s, [1.0] * 5, 4096)
    assert isinstance(lay, TensorLayout), lay
    heads = sorted(h for share in lay.shares for h in share.heads(lay.grid))
    assert heads == list(range(48))
    assert len({share.n_heads for share in lay.shares}) > 1  # really uneven


# --- Step-3.5: sliding layers with heads of their own ---------------------------------------

# Shaped like Step-3.5-Flash at 4 bits: a full-attention layer (64 heads / 8 KV heads) then
# three sliding-window ones (96 / 8, a 512-token window), the first 3 layers dense, then 288
# experts beside a shared one; layer_types also lists its multi-token-prediction layers
STEP3P5_FLASH: dict[str, Any] = {
    "model_type": "step3p5",
    "num_hidden_layers": 45,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_attention_groups": 8,
    "head_dim": 128,
    "vocab_size": 128896,
    "intermediate_size": 11264,
    "moe_num_experts": 288,
    "moe_top_k": 8,
    "moe_intermediate_size": 1280,
    "share_expert_dim": 1280,
    "moe_layers_enum": ",".join(str(i) for i in range(3, 45)),
    "layer_types": ["sliding_attention" if i % 4 else "full_attention" for i in range(48)],
    "attention_other_setting": {"num_attention_heads": 96, "num_attention_groups": 8},
    "sliding_window": 512,
    "use_head_wise_attn_gate": True,
    "tie_word_embeddings": False,
    "quantization": {"bits": 4, "group_size": 64},
}


def step3p5(**over: Any) -> ModelSpec:
    return spec_from_config(STEP3P5_FLASH | over)


def test_step3p5_reads_both_attention_kinds_and_its_experts() -> None:
    s = step3p5()
    assert (s.heads, s.kv_heads, s.other_heads, s.other_kv_heads) == (64, 8, 96, 8)
    assert s.sliding_layers == tuple(i for i in range(45) if i % 4) and s.sliding_window == 512
    assert s.sparse_layers == tuple(range(3, 45)) and s.experts == 288
    assert (s.experts_per_token, s.shared_intermediate) == (8, 1280)
    assert s.uneven_supported and s.head_gate
    assert widths_for(s) == {"mlp": 11264, "expert": 1280, "shared": 1280}
    grid = grid_for(s, 4096)
    assert grid.other is not None and (grid.other.heads, grid.other.kv_heads) == (96, 8)
    # the same head counts on both kinds: one grid, no second share
    same = step3p5(attention_other_setting={"num_attention_heads": 64, "num_attention_groups": 8})
    assert not same.has_other and grid_for(same, 4096).other is None
    assert all(not share.other for share in _layout(same, [1.0] * 3).shares)
    with pytest.raises(InputError, match="attention_other_setting: num_attention_groups: 5"):
        step3p5(attention_other_setting={"num_attention_heads": 96, "num_attention_groups": 5})


def _layout(s: ModelSpec, weights: list[float]) -> TensorLayout:
    lay = tensor_layout(s, weights, 4096)
    assert isinstance(lay, TensorLayout), lay
    return lay


@pytest.mark.parametrize("weights", [[1.0] * 3, [1.0] * 5, [3.0, 1.0, 1.0], [2.0, 2, 1, 1, 1]])
def test_step3p5_splits_each_attention_kind_over_ranks_that_divide_neither(
    weights: list[float],
) -> None:
    s = step3p5()
    lay = _layout(s, weights)
    grid, other = lay.grid, lay.grid.other
    assert other is not None
    full = sorted(h for share in lay.shares for h in share.heads(grid))
    sliding = sorted(h for share in lay.shares for h in share.kind(True).heads(other))
    assert full == list(range(64)) and sliding == list(range(96))  # each held exactly once
    check_cover(lay.shares, grid, widths_for(s))
    # every full-layer head once but a sliding one twice: refused (it would decode wrong)
    twice = [lay.shares[0], replace(lay.shares[1], other=lay.shares[0].other), *lay.shares[2:]]
    with pytest.raises(InputError, match="sliding-layer query heads for 96, not each exactly once"):
        check_cover(twice, grid, widths_for(s))
    # both kinds follow the same weights: the heaviest rank holds the most of each
    heavy = max(range(len(weights)), key=lambda r: weights[r])
    if len(set(weights)) > 1:
        assert lay.shares[heavy].n_heads == max(share.n_heads for share in lay.shares)
        assert lay.shares[heavy].kind(True).n_heads == max(
            share.kind(True).n_heads for share in lay.shares
        )
    # the job's JSON: the sliding layers' blocks under their own key, read back the same
    for share in lay.shares:
        raw = json.loads(json.dumps(share.to_json()))
        assert set(raw) == {"attention", "attention_other", "mlp", "expert", "shared"}
        assert RankShare.from_json(raw, grid, widths_for(s)) == share
    # a share without the sliding layers' blocks, or with a sliding KV head past 8: refused
    raw = lay.shares[0].to_json()
    with pytest.raises(InputError, match="attention_other None"):
        RankShare.from_json(
            {k: v for k, v in raw.items() if k != "attention_other"}, grid, widths_for(s)
        )
    with pytest.raises(InputError, match=r"attention_other kv \[0, 9\]"):
        RankShare.from_json(raw | {"attention_other": [[0, 9, 0, 12]]}, grid, widths_for(s))


def test_a_model_of_one_attention_kind_refuses_a_second_share() -> None:
    lay = _layout(new_family("ministral3"), [1.0] * 3)
    raw = lay.shares[0].to_json() | {"attention_other": [[0, 1, 0, 4]]}
    with pytest.raises(InputError, match="not a share of this model"):
        RankShare.from_json(raw, lay.grid, {"mlp": 14336})


def test_step3p5_rank_memory_counts_each_kind_with_its_heads_and_window() -> None:
    s = step3p5()
    context, per_kv = 8192, 2 * 128 * 2  # keys and values of a KV head, bf16, a token
    lay = _layout(s, [1.0] * 3)
    full = [i for i in range(45) if i % 4 == 0]
    for share, cost in zip(lay.shares, rank_costs(s, lay, context), strict=True):
        mine = share.kind(True)
        want = len(full) * share.n_kv * per_kv * context  # full layers: the whole context
        want += (45 - len(full)) * mine.n_kv * per_kv * 512  # sliding ones: the window only
        assert cost.kv_cache_bytes == pytest.approx(want)
    # the sliding layers' heads are weighed too: 96 of them (and their KV heads, replicas
    # counted) cost more than 64 would
    plain = step3p5(attention_other_setting=None)
    plain_lay = _layout(plain, [1.0] * 3)
    many = sum(c.weight_bytes for c in rank_costs(s, lay, context))
    few = sum(c.weight_bytes for c in rank_costs(plain, plain_lay, context))
    pb = s.param_bytes(4) * s.scale
    per_head = (2 * 4096 * 128 + 4096) * pb  # q rows, o columns, a g_proj row
    per_kv_head = 2 * 4096 * 128 * pb  # k and v rows
    replicas = sum(x.kind(True).n_kv for x in lay.shares) - sum(x.n_kv for x in plain_lay.shares)
    want = len(s.sliding_layers) * (32 * per_head + replicas * per_kv_head)
    assert many - few == pytest.approx(want, rel=1e-6)
    # one process's cache: the window on a sliding layer (mlx-lm's RotatingKVCache)
    assert s.layer_cache_bytes(1, context) == 8 * per_kv * 512
    assert s.layer_cache_bytes(4, context) == 8 * per_kv * context
    assert s.layer_cache_bytes(1, 100) == 8 * per_kv * 100


def test_step3p5_plans_tensor_over_three_ultras_and_round_trips() -> None:
    s = step3p5()
    plan = plan_cluster(check(ultras3().facts()), s, strategy="tensor")
    assert plan.ok and plan.strategy == "tensor" and plan.world_size == 3, plan
    raw = json.loads(json.dumps(plan.to_json()))
    assert sum(r["heads"] for r in raw["ranks"]) == 64
    assert sum(r["other_heads"] for r in raw["ranks"]) == 96
    assert all("attention_other" in r["tensor_share"] for r in raw["ranks"])
    assert Plan.from_json(raw).to_json() == raw
    assert plan_layout(s, Plan.from_json(raw)).shares == plan_layout(s, plan).shares
    # the text plan names each rank's sliding heads too
    text = plan_text(plan)
    for r in raw["ranks"]:
        assert f"{r['other_heads']} sliding heads" in text, text
        assert f"{r['other_kv_heads']} sliding KV" in text, text
