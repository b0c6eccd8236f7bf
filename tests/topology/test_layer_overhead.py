"""A CPU's work besides the matmuls, on recorded host facts: a layer's small ops and the exp-type
passes (SiLU, softmax) the microbenchmark timed are added to every rank's step, the exp-type
part by the elements its share covers, so a float32 prefill is no longer called twice as fast as
it runs; a GPU and rates recorded without these figures are planned as before."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_compute_term import LINUX_RATES, linux, small_spec

from topology.host_rates import HostRates, activation_dtype, parse_rates
from topology.planning.plan import plan_local
from topology.planning.predict import RankRate, stage_exp_elements
from topology.planning.tensor_costs import rank_costs, tensor_layout

# The 2-core box of test_compute_term with its layer figures: 300 us of small ops a layer and
# 15 ns an exp-type element for float32 activations (what the microbenchmark recorded here).
LAYER_RATES = {**LINUX_RATES, "layer_us": {"float32": 300.0, "bfloat16": 400.0},
               "exp_ns": {"float32": 15.0, "bfloat16": 17.0}, "threads": 2}  # fmt: skip


def host(rates: dict[str, object] = LAYER_RATES):  # type: ignore[no-untyped-def]
    return linux(rates)  # type: ignore[arg-type]


def test_the_figures_round_trip_and_bad_ones_are_one_reason() -> None:
    rates = parse_rates(json.dumps(LAYER_RATES))
    assert rates.layer_us == {"float32": 300.0, "bfloat16": 400.0}
    assert parse_rates(json.dumps(rates.to_json())) == rates
    assert parse_rates(json.dumps(LINUX_RATES)).layer_us == {}  # recorded before: none
    for change, says in (
        ({"layer_us": []}, "layer_us: must be an object"),
        ({"exp_ns": {"q4": 1.0}}, "is not one of"),
        ({"exp_ns": {"float32": -1}}, "exp_ns.float32: must be a positive number"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_rates(json.dumps({**LAYER_RATES, **change}))


def test_a_cpu_rank_pays_them_and_crowded_cores_share_them_in_time() -> None:
    rates = dataclasses.replace(parse_rates(json.dumps(LAYER_RATES)), threads=2)
    assert rates.layer_costs("float32") == pytest.approx((300e-6, 15e-9))
    # 2 ranks on 2 cores: no core to spare, each builds and evaluates in turn (below)
    assert rates.layer_costs("float32", ranks=2) == pytest.approx((600e-6, 15e-9))
    assert rates.layer_costs("float32", ranks=3) == pytest.approx((900e-6, 22.5e-9))
    # pipeline stages take turns: each has the cores to itself
    assert rates.layer_costs("float32", ranks=3, together=False) == pytest.approx((600e-6, 15e-9))
    assert rates.layer_costs("float16") is None  # not measured
    gpu: HostRates = dataclasses.replace(rates, device="gpu")
    assert gpu.layer_costs("float32") is None  # a GPU's small kernels overlap the large ones
    assert (activation_dtype("q4"), activation_dtype("q4-float32")) == ("bfloat16", "float32")


def test_a_rank_with_no_core_to_spare_builds_its_graph_and_evaluates_it_in_turn() -> None:
    """A lone process builds the next step's graph while another core evaluates this one: its
    layers' figure counts once. Where its BLAS threads or the other ranks take every core, both
    are done in turn and it counts twice. The kind decides: float32 runs OpenBLAS on every core
    a rank has (a one-thread figure was measured for it), bfloat16 and 4-bit MLX's own kernels
    on one."""
    one = {"float32": {"1": 2.0, "8": 12.0, "512": 20.0}}
    rates = dataclasses.replace(
        parse_rates(json.dumps({**LAYER_RATES, "one_thread_gflops": one})), threads=4
    )
    assert rates.layer_costs("float32") == pytest.approx((600e-6, 15e-9))  # BLAS on all 4
    assert rates.layer_costs("q4-float32") == pytest.approx((300e-6, 15e-9))  # one thread
    assert rates.layer_costs("bfloat16", ranks=3) == pytest.approx((400e-6, 17e-9))  # 1 spare
    assert rates.layer_costs("q4", ranks=4) == pytest.approx((800e-6, 17e-9))  # none spare
    assert rates.layer_costs("float32", ranks=2) == pytest.approx((600e-6, 15e-9))  # 2 threads each


def test_the_exp_elements_follow_each_ranks_share() -> None:
    """SmolLM2's shape: softmax over 9 heads x the context, SiLU over 1,536 a layer; tensor x3
    gives each rank a third of both, every rank runs every layer."""
    spec = small_spec()
    whole = stage_exp_elements(spec, (0, 30), 100)
    assert whole == 30 * (9 * 100 + 1536)
    lay = tensor_layout(spec, [1.0, 1.0, 1.0], 100)
    assert not isinstance(lay, str)
    costs = rank_costs(spec, lay, 100)
    for c in costs:
        assert c.layers == 30
        assert c.exp_elements == (30 * 3 * 100, 30 * 512, 0.0)
    rate = RankRate(1.0, memory=False, layer_s=300e-6, exp_s=15e-9)
    assert rate.other_s(30, whole, 4) == pytest.approx(30 * 300e-6 + 4 * whole * 15e-9)


def test_decode_and_prefill_take_longer_by_the_layer_figures() -> None:
    """One rank: decode adds 30 layers x 300 us and a row's exp elements; a 512-token prompt
    adds its rows' exp elements, which at float32's 40 GFLOP/s is a large part of prefill."""
    spec = small_spec()
    before = plan_local(linux(), 1, spec, context=512, prompt_tokens=512)
    after = plan_local(host(), 1, spec, context=512, prompt_tokens=512)
    decode_gap = 1 / (after.predicted_decode_tok_s or 1) - 1 / (before.predicted_decode_tok_s or 1)
    per_row = stage_exp_elements(spec, (0, 30), 512) * 15e-9
    assert decode_gap == pytest.approx(30 * 300e-6 + per_row, rel=0.02)
    ttft_gap = (after.predicted_ttft_s or 0) - (before.predicted_ttft_s or 0)
    assert ttft_gap == pytest.approx(30 * 300e-6 + 512 * per_row, rel=0.02)
    assert ttft_gap > 0.3 * (before.predicted_ttft_s or 0)


def test_pipeline_stages_pay_for_their_own_layers() -> None:
    spec = small_spec()
    one = plan_local(host(), 1, spec, strategy="pipeline", prompt_tokens=512)
    two = plan_local(host(), 2, spec, strategy="pipeline", prompt_tokens=512)
    without = plan_local(linux(), 2, spec, strategy="pipeline", prompt_tokens=512)
    gap = (two.predicted_ttft_s or 0) - (without.predicted_ttft_s or 0)
    # both stages together pay for the 30 layers once (they take turns)
    assert gap == pytest.approx((one.predicted_ttft_s or 0) - (
        plan_local(linux(), 1, spec, strategy="pipeline", prompt_tokens=512).predicted_ttft_s
        or 0), rel=0.05)  # fmt: skip
