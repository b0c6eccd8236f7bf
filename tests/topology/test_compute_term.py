"""The step-time model's compute term, on recorded host facts: a host's measured rates
(rates.json) make a compute-bound host slow in the plan, a host never measured is planned by
its memory alone and the plan says so."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from paths import FIXTURES

from topology.chips import DECODE_BANDWIDTH_EFFICIENCY, GIB
from topology.facts import HostFacts
from topology.host_rates import HostRates, parse_rates, weight_kind
from topology.model.spec import ModelSpec, spec_from_config
from topology.planning import predict
from topology.planning.options import share_weights
from topology.planning.placement import Slot
from topology.planning.plan import plan_local
from topology.planning.predict import RankRate, busy_s, stage_flops
from topology.planning.tensor_costs import RankCost, balanced_layout

# A 2-core Linux box as `python -m cluster.microbench` recorded it (OpenBLAS): bandwidth-bound
# copies at 10 GB/s, float32 matmuls at 4 GFLOP/s for one row and 40 for a 512-row chunk.
LINUX_RATES = {
    "copy_gbs": 10.0,
    "matmul_gflops": {
        "float32": {"1": 4.0, "8": 20.0, "512": 40.0},
        "bfloat16": {"1": 2.0, "8": 8.0, "512": 10.0},
        "q4": {"1": 0.3, "8": 0.3, "512": 0.3},
        "q4-float32": {"1": 3.0, "8": 3.0, "512": 3.0},
    },
    "device": "cpu",
}


def small_spec(**change: Any) -> ModelSpec:
    """SmolLM2-135M's shape in float32 (the real model the tests decode)."""
    cfg = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        **change,
    }
    return spec_from_config(cfg)


def linux(rates: dict[str, Any] | None = LINUX_RATES) -> HostFacts:
    parsed = parse_rates(json.dumps(rates)) if rates else None
    return HostFacts(name="localhost", memory_bytes=16 * GIB, is_mac=False, rates=parsed)


def test_rates_interpolate_in_log_rows_and_stay_flat_beyond() -> None:
    rates = parse_rates(json.dumps(LINUX_RATES))
    assert rates.gflops("float32", 1) == 4.0 and rates.gflops("float32", 512) == 40.0
    assert rates.gflops("float32", 4096) == 40.0  # flat beyond the largest row count measured
    assert rates.gflops("float32", 64) == pytest.approx(30.0)  # halfway 8 -> 512 in log rows
    assert rates.gflops("float16", 1) is None  # not measured
    assert rates.to_json()["matmul_gflops"]["q4-float32"] == {"1": 3.0, "8": 3.0, "512": 3.0}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"copy_gbs": 0, "matmul_gflops": {"q4": {"1": 1}}}', "copy_gbs"),
        ('{"copy_gbs": 1, "matmul_gflops": {"q5": {"1": 1}}}', "is not one of"),
        ('{"copy_gbs": 1, "matmul_gflops": {"q4": {"one": 1}}}', "is not a row count"),
        ('{"copy_gbs": 1, "matmul_gflops": {"q4": {"1": true}}}', "positive number"),
        ('{"copy_gbs": 1, "matmul_gflops": {}}', "matmul_gflops"),
        ('{"copy_gbs": 1, "matmul_gflops": {"q4": {"1": 1}}, "device": "npu"}', "device"),
    ],
)
def test_a_bad_rates_file_is_one_reason(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_rates(text)


def test_weight_kinds() -> None:
    assert weight_kind("float32", 32) == "float32"
    assert weight_kind("bfloat16", 16) == "bfloat16"
    assert (weight_kind("bfloat16", 4), weight_kind("bfloat16", 8)) == ("q4", "q8")
    assert weight_kind("float32", 4) == "q4-float32"  # CPU kernels differ by activation dtype


def test_a_phase_takes_the_slower_of_memory_and_compute() -> None:
    # 1 ms of memory at decoding's efficiency; 2 GFLOP at 1 GFLOP/s: compute binds
    one = RankRate(1.0)
    assert busy_s(0.54e-3, 2e9, one) == pytest.approx(2.0)
    assert busy_s(0.54e-3, 1e3, one) == pytest.approx(1e-3)  # memory binds
    assert busy_s(0.54e-3, 2e9, RankRate()) == pytest.approx(1e-3)  # not measured: memory alone
    assert busy_s(0.54e-3, 2e9, one, rows=8) == pytest.approx(16.0)  # rows multiply the work
    # a CPU's measured matvec already streamed its weight from memory: its rate alone counts
    assert busy_s(0.54e-3, 1e3, RankRate(1.0, memory=False)) == pytest.approx(1e-6)
    # activations' own products at their rate (none given: the weights')
    both = RankRate(1.0, memory=False, activation_gflops=4.0)
    assert busy_s(0, 1e9, both, 2, activation_flops=4e9) == pytest.approx(2 + 2)
    assert busy_s(0, 1e9, one, 2, activation_flops=4e9) == pytest.approx(2 + 8)


def test_a_measured_cpu_host_is_planned_compute_bound() -> None:
    """--local 1 on a CPU that does 4 GFLOP/s a row: SmolLM2 float32 (~0.27 GFLOP a token)
    decodes at ~15 tok/s, the measured rate's figure (its matvec streamed its weight from
    memory: the copy bandwidth does not count on a CPU); memory alone predicted several times
    that (the 12x error issue 29 starts from)."""
    spec = small_spec()
    slow_copies = {**LINUX_RATES, "copy_gbs": 0.5}
    measured = plan_local(linux(slow_copies), 1, spec, context=64)
    memory_only = plan_local(linux(None), 1, spec, context=64)
    assert measured.ok and memory_only.ok
    tok = measured.predicted_decode_tok_s or 0
    flops_bound = 4e9 / (2 * spec.active_bytes_per_token / 4)
    assert 0.8 * flops_bound < tok < flops_bound
    assert (memory_only.predicted_decode_tok_s or 0) > 3 * tok
    assert not any("not measured" in a for a in measured.assumptions)
    assert any("compute of localhost not measured" in a for a in memory_only.assumptions)


def test_local_ranks_share_the_measured_compute() -> None:
    """Two ranks on one machine get half its cores each: pipeline x2 is no faster than one
    rank, and tensor x2 of a compute-bound model is not twice as fast."""
    spec = small_spec()
    one = plan_local(linux(), 1, spec).predicted_decode_tok_s or 0
    pipeline = plan_local(linux(), 2, spec, strategy="pipeline").predicted_decode_tok_s or 0
    tensor = plan_local(linux(), 2, spec, strategy="tensor").predicted_decode_tok_s or 0
    assert pipeline < one
    assert tensor < 1.1 * one


def test_quantized_weights_use_their_own_rate() -> None:
    """4-bit weights on this CPU: 3 GFLOP/s at every row count (MLX's CPU q4 matmul)."""
    q4 = small_spec(quantization={"group_size": 64, "bits": 4})
    f32 = small_spec()
    assert q4.bits == 4
    q4_tok = plan_local(linux(), 1, q4).predicted_decode_tok_s or 0
    f32_tok = plan_local(linux(), 1, f32).predicted_decode_tok_s or 0
    # fewer bytes, but a slower matmul per FLOP: q4 is not 8x faster here, as it is on a Mac
    assert q4_tok < 2 * f32_tok


def test_attention_scores_run_at_the_activations_rate_not_the_weights() -> None:
    """A 4-bit model with float32 activations: its weights multiply at q4-float32's 3 GFLOP/s,
    its scores (activations by activations) at float32's 40. Charged at the weights' rate,
    the grid's 4-bit TTFT came out 16-29 % slow on every row."""
    q4 = small_spec(quantization={"group_size": 64, "bits": 4})
    floats_gone = {**LINUX_RATES, "matmul_gflops": {"q4-float32": {"1": 3.0, "512": 3.0}}}
    # two 512-row chunks, then the one-row step of the last prompt token (float32 at 1 row: 4)
    fast = plan_local(linux(), 1, q4, context=2048, prompt_tokens=1025).predicted_ttft_s or 0
    slow = plan_local(linux(floats_gone), 1, q4, context=2048, prompt_tokens=1025)
    chunks = sum(512 * stage_flops(q4, (0, 30), reach)[1] for reach in (512, 1024))
    last = stage_flops(q4, (0, 30), 1025)[1]
    assert (slow.predicted_ttft_s or 0) - fast == pytest.approx(
        (chunks * (1 / 3 - 1 / 40) + last * (1 / 3 - 1 / 4)) / 1e9, rel=1e-4
    )  # the plan rounds its seconds


def test_a_mac_with_rates_keeps_its_chip_bandwidth() -> None:
    """A Mac's bandwidth stays the chip table's (the decode efficiency is fitted to it); its
    measured compute only adds a floor."""
    fast = HostRates(700.0, {"bfloat16": {1: 1e5, 512: 2e4}})
    spec = spec_from_config(
        json.loads((FIXTURES / "models/qwen3-32b-8bit/config.json").read_text())
    )
    mac = HostFacts(name="localhost", chip="Apple M3 Ultra", memory_bytes=512 * GIB)
    plain = plan_local(mac, 1, spec).predicted_decode_tok_s
    measured = plan_local(dataclasses.replace(mac, rates=fast), 1, spec).predicted_decode_tok_s
    assert plain == measured  # q8 weights: the rates have no q8 row, so memory alone


def test_prefill_is_predicted_only_where_compute_was_measured() -> None:
    """A 1,024-token prompt in two 512-row chunks at the measured 512-row rate (40 GFLOP/s
    float32): TTFT is about the prompt's FLOPs over that rate; unmeasured: no figure."""
    spec = small_spec()
    plan = plan_local(linux(), 1, spec, context=2048, prompt_tokens=1024)
    assert plan.prompt_tokens == 1024 and plan.predicted_ttft_s is not None
    weights_flops = 2 * spec.active_bytes_per_token / 4
    assert plan.predicted_ttft_s >= 1024 * weights_flops / 40e9
    assert plan.predicted_ttft_s < 3 * 1024 * weights_flops / 40e9
    assert plan.predicted_prefill_tok_s == pytest.approx(1024 / plan.predicted_ttft_s, rel=0.01)
    # prefill's 512-row chunks run far faster per token than decode's single rows
    assert plan.predicted_prefill_tok_s > 3 * (plan.predicted_decode_tok_s or 0)
    longer = plan_local(linux(), 1, spec, context=8192, prompt_tokens=4096)
    assert (longer.predicted_ttft_s or 0) > 4 * plan.predicted_ttft_s  # attention grows too
    unmeasured = plan_local(linux(None), 1, spec, prompt_tokens=1024)
    assert unmeasured.predicted_ttft_s is None and unmeasured.predicted_prefill_tok_s is None
    again = type(plan).from_json(json.loads(json.dumps(plan.to_json())))
    assert again.predicted_ttft_s == plan.predicted_ttft_s and again.prompt_tokens == 1024


def test_pipeline_prefill_runs_stages_one_after_another() -> None:
    spec = small_spec()
    one = plan_local(linux(), 1, spec, prompt_tokens=1024)
    two = plan_local(linux(), 2, spec, strategy="pipeline", prompt_tokens=1024)
    # two stages, each on half the machine's compute, one after the other: no faster
    assert (two.predicted_ttft_s or 0) >= 0.95 * (one.predicted_ttft_s or 0)


def test_ranks_that_share_a_cpu_split_its_cores_and_a_gpu_shares_one_device() -> None:
    """A 2-core host measured on both threads and on one: a rank of two has one core (its
    one-thread rate); beyond the cores, ranks share them in time; kinds MLX computes itself
    (one thread anyway) keep their rate while cores last; a GPU is divided."""
    rates = HostRates(
        10.0,
        {"float32": {1: 4.0, 8: 20.0, 512: 40.0}, "q4-float32": {1: 3.0, 512: 3.0}},
        "cpu",
        threads=2,
        one_thread_gflops={"float32": {1: 3.5, 8: 12.0, 512: 21.0}},
    )
    assert rates.shared_gflops("float32", 1, 1) == 4.0
    assert rates.shared_gflops("float32", 1, 2) == 3.5
    assert rates.shared_gflops("float32", 512, 2) == 21.0
    assert rates.shared_gflops("float32", 1, 3) == pytest.approx(3.5 * 2 / 3)
    assert rates.shared_gflops("q4-float32", 1, 2) == 3.0
    assert rates.shared_gflops("q4-float32", 1, 4) == 1.5
    eight = dataclasses.replace(rates, threads=8)  # 2 ranks of 4 threads: 3/7 of the way up
    assert eight.shared_gflops("float32", 512, 2) == pytest.approx(21.0 + 19.0 * 3 / 7)
    gpu = dataclasses.replace(rates, device="gpu")
    assert gpu.shared_gflops("float32", 512, 2) == 20.0
    # pipeline stages compute one at a time: no sharing in time, each on its own threads
    assert rates.shared_gflops("float32", 1, 3, together=False) == 3.5
    assert gpu.shared_gflops("float32", 512, 2, together=False) == 40.0
    assert parse_rates(json.dumps(rates.to_json())) == dataclasses.replace(rates, source="measured")
    # a plan of two ranks on it decodes at the one-thread rate, not half the two-thread one
    host = dataclasses.replace(linux(), rates=rates)
    spec = small_spec()
    halved = plan_local(linux(), 2, spec, strategy="tensor").predicted_decode_tok_s or 0
    split = plan_local(host, 2, spec, strategy="tensor").predicted_decode_tok_s or 0
    assert split > 1.2 * halved


def test_crowded_cores_run_short_pieces_whole_and_long_ones_in_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3 tensor ranks on 2 cores: a rank's piece of work between two all-reduces that fits in
    the scheduler's slice runs to its end on one core, so each piece takes ceil(3 / 2) = 2x its
    time alone, not the 1.5x of an even share; a long piece waits about one slice more."""
    rates = HostRates(10.0, {"float32": {1: 4.0, 512: 40.0}}, "cpu", threads=2)
    assert rates.crowding(2) == (1.0, 1.0)
    assert rates.crowding(3) == (1.5, 2.0)
    assert rates.crowding(5) == (2.5, 3.0)
    assert rates.crowding(3, together=False) == (1.0, 1.0)  # pipeline stages take turns
    assert dataclasses.replace(rates, device="gpu").crowding(3) == (1.0, 1.0)
    rate = RankRate(gflops=1.0, crowding=(1.5, 2.0))
    short = 30 * 1.5 * 0.001  # 30 pieces of 1 ms alone, at the even share
    assert short + rate.waits_s(short, 30) == pytest.approx(30 * 2 * 0.001)
    long = 2 * 1.5 * 0.1  # 2 pieces of 100 ms alone
    assert rate.waits_s(long, 2) == pytest.approx(2 * 0.5 * predict.SCHEDULER_SLICE_S)
    assert RankRate(gflops=1.0).waits_s(short, 30) == 0.0
    # and the plan of 3 tensor ranks on a 2-core host pays it
    spec, host = small_spec(), linux({**LINUX_RATES, "threads": 2})
    crowded = plan_local(host, 3, spec, strategy="tensor").predicted_decode_tok_s or 0
    monkeypatch.setattr(predict, "SCHEDULER_SLICE_S", 0.0)
    even = plan_local(host, 3, spec, strategy="tensor").predicted_decode_tok_s or 0
    assert crowded < 0.9 * even


def test_tensor_ranks_on_cpu_cores_of_their_own_wait_for_the_slower_piece() -> None:
    """2 tensor ranks on CPU cores of their own: every piece between two all-reduces waits for
    the slower rank's, LOCKSTEP_WAIT of its time; one rank alone, pipeline stages, a GPU's
    ranks (the fitted overhead holds it) and crowded cores (measured with it) pay no more."""
    cost = RankCost(0, 0, 1e6, 1e6, 1e4, flops=(1e6, 2e6, 1e4), layers=4)
    cpu = RankRate(gflops=1.0, memory=False)
    alone = predict.tensor_phases([cost], [10.0], [cpu])
    pair = predict.tensor_phases([cost, cost], [10.0, 10.0], [cpu, cpu])
    for one, two in zip(alone, pair, strict=True):
        assert two == [pytest.approx(one[0] * (1 + predict.LOCKSTEP_WAIT))] * 2
    gpu = RankRate(gflops=1.0)
    assert predict.tensor_phases([cost, cost], [10.0, 10.0], [gpu, gpu]) == [
        [t, t] for (t,) in predict.tensor_phases([cost], [10.0], [gpu])
    ]
    crowded = RankRate(gflops=1.0, memory=False, crowding=(1.5, 2.0))
    busy = predict.tensor_phases([cost], [10.0], [cpu])[0][0]
    three = predict.tensor_phases([cost] * 3, [10.0] * 3, [crowded] * 3)[0][0]
    assert three == pytest.approx(busy + crowded.waits_s(busy, 4))
    # and a plan of 2 tensor ranks on a 2-core host pays it, its pipeline does not
    spec, host = small_spec(), linux({**LINUX_RATES, "threads": 2})
    lockstep = plan_local(host, 2, spec, strategy="tensor").predicted_decode_tok_s or 0
    staged = plan_local(host, 2, spec, strategy="pipeline").predicted_decode_tok_s or 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(predict, "LOCKSTEP_WAIT", 0.0)
        free = plan_local(host, 2, spec, strategy="tensor").predicted_decode_tok_s or 0
        assert plan_local(host, 2, spec, strategy="pipeline").predicted_decode_tok_s == staged
    assert lockstep < 0.97 * free
    notes = plan_local(host, 2, spec, strategy="tensor").assumptions
    assert any("wait at every all-reduce for the slower one: 7%" in n for n in notes)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"threads": 0}, "threads: must be a whole number"),
        ({"threads": True}, "threads: must be a whole number"),
        ({"one_thread_gflops": []}, "one_thread_gflops: must be an object"),
        ({"one_thread_gflops": {"float32": {"1": -1}}}, "one_thread_gflops.float32.1: must be"),
    ],
)
def test_bad_thread_figures_are_one_reason(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_rates(json.dumps({**LINUX_RATES, **change}))


def test_more_local_ranks_than_cores_is_said() -> None:
    rates = dataclasses.replace(parse_rates(json.dumps(LINUX_RATES)), threads=2)
    host = dataclasses.replace(linux(), rates=rates)
    three = plan_local(host, 3, small_spec(), strategy="pipeline")
    assert any("3 ranks share 2 cores" in a for a in three.assumptions)
    two = plan_local(host, 2, small_spec(), strategy="pipeline")
    assert not any("share 2 cores" in a for a in two.assumptions)


def test_tensor_shares_follow_measured_compute_where_it_binds() -> None:
    """Two CPU nodes of equal bandwidth, one with half the other's measured compute: a decoding
    token's weights stream at its compute rate there, so it holds about half the share. A Mac
    whose GPU outruns its memory keeps the share its bandwidth gives; unmeasured: bandwidth."""
    spec = small_spec()
    fast = HostRates(10.0, {"float32": {1: 8.0, 512: 40.0}}, "cpu")
    slow = dataclasses.replace(fast, matmul_gflops={"float32": {1: 4.0, 512: 20.0}})
    a = Slot("a", "a", None, None, 100.0, rates=fast)
    weights = share_weights(spec, [a, dataclasses.replace(a, host="b", rates=slow)])
    assert weights[0] == pytest.approx(2 * weights[1])
    # GFLOP/s x 4 bytes a weight / 2 FLOPs, as the bandwidth busy_s would turn into that time
    assert weights[0] == pytest.approx(8.0 * 4 / 2 / DECODE_BANDWIDTH_EFFICIENCY)
    lay = balanced_layout(spec, weights, [None, None], 2048, lambda c: 0)
    assert not isinstance(lay, str)
    widths = [share.width("mlp") for share in lay.shares]
    assert widths[0] == pytest.approx(2 * widths[1], rel=0.1), widths
    mac = Slot("m", "m", None, None, 819.0, rates=HostRates(700.0, {"float32": {1: 1e5}}))
    bare = dataclasses.replace(mac, rates=None)
    assert share_weights(spec, [mac, bare]) == [819.0, 819.0]


def test_tensor_ranks_multiply_their_shares_at_the_rates_measured_on_them() -> None:
    """--local N: rates timed on a tensor rank's own, narrower matrices (OpenBLAS runs a third
    of a 1024x2048 layer at 2.5x the whole's rate on one thread here) are the tensor ranks';
    pipeline stages multiply by whole layers at the host's."""
    spec = small_spec(torch_dtype="float32")
    host = linux()
    assert host.rates is not None
    table = {**host.rates.matmul_gflops, "float32": {1: 12.0, 8: 60.0, 512: 40.0}}
    shares = dataclasses.replace(host.rates, matmul_gflops=table)
    for strategy, faster in (("tensor", True), ("pipeline", False)):
        plain = plan_local(host, 2, spec, strategy=strategy)
        shared = plan_local(host, 2, spec, strategy=strategy, share_rates=shares)
        assert plain.ok and shared.ok
        assert plain.predicted_decode_tok_s and shared.predicted_decode_tok_s
        ratio = shared.predicted_decode_tok_s / plain.predicted_decode_tok_s
        assert ratio > 1.5 if faster else ratio == 1.0


def test_the_first_token_comes_from_a_decode_step_after_the_prompt_less_one() -> None:
    """mlx-lm reads a prompt's tokens but the last, then feeds that one in its first decode
    step: a two-token prompt waits two one-row steps, not one step of two rows (the grid's
    256-token TTFT over tensor ranks came out 15-40 % short without that step)."""
    spec = small_spec()
    two = plan_local(linux(), 2, spec, strategy="tensor", context=2, prompt_tokens=2)
    step = 1 / (two.predicted_decode_tok_s or 1)  # at a context of 2: within 0.1 % of 1's
    assert two.predicted_ttft_s == pytest.approx(2 * step, rel=2e-3)
