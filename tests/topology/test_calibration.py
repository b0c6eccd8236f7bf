"""The Calibration the planner takes from `bench --calibrate`: fitting, JSON, and its effect."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from topology.chips import BACKENDS, GIB, BackendCost, step_overhead_s
from topology.facts import HostFacts
from topology.model.spec import spec_from_config
from topology.planning.calibration import (
    Calibration,
    LinkMeasurement,
    StepTimes,
    calibration_notes,
)
from topology.planning.plan import plan_local
from topology.planning.predict import tensor_comms_s

SMALL, LARGE = 16384, 32 << 20
# Shapes of a small llama (the planner needs only config.json's fields).
LLAMA = {
    "model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
    "vocab_size": 32000, "torch_dtype": "bfloat16",
}  # fmt: skip
STUDIO = HostFacts(name="localhost", chip="Apple M3 Ultra", memory_bytes=512 * GIB)


@pytest.mark.parametrize(("name", "n"), [("ring-local", 2), ("ring", 4), ("jaccl", 3)])
def test_fit_recovers_the_hop_and_bandwidth_that_produced_the_timings(name: str, n: int) -> None:
    base = BACKENDS[name]
    truth = BackendCost(name, hop_s=40e-6, link_bytes_per_s=3e9, mesh=base.mesh)
    measured = LinkMeasurement(
        name, n, SMALL, truth.all_reduce_s(n, SMALL), LARGE, truth.all_reduce_s(n, LARGE)
    )
    fitted = measured.fit(base)
    assert math.isclose(fitted.hop_s, 40e-6, rel_tol=1e-6)
    assert math.isclose(fitted.link_bytes_per_s, 3e9, rel_tol=1e-6)
    assert (fitted.name, fitted.mesh) == (base.name, base.mesh)


def test_fit_keeps_the_published_bandwidth_when_large_is_not_slower() -> None:
    base = BACKENDS["ring"]
    fitted = LinkMeasurement("ring", 2, SMALL, 1e-3, LARGE, 1e-3).fit(base)
    assert fitted.link_bytes_per_s == base.link_bytes_per_s
    assert fitted.hop_s >= 0


def test_json_round_trip_and_merge_replaces_only_what_was_measured() -> None:
    ring = LinkMeasurement("ring", 2, SMALL, 1e-4, LARGE, 5e-2)
    old = Calibration((ring,), (("a", 100.0), ("b", 200.0)))
    assert Calibration.from_json(old.to_json()) == old
    jaccl = LinkMeasurement("jaccl", 2, SMALL, 2e-5, LARGE, 5e-3)
    new = Calibration((replace(ring, small_s=3e-4), jaccl), (("b", 250.0),))
    merged = old.merged(new)
    assert merged.bandwidth("a") == 100.0 and merged.bandwidth("b") == 250.0
    assert {k.cost_name: k.small_s for k in merged.links} == {"ring": 3e-4, "jaccl": 2e-5}


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"links": [], "host_bandwidth_gbs": []},
        {"links": [], "host_bandwidth_gbs": {"a": -1}},
        {"links": [{"cost_name": "ring"}], "host_bandwidth_gbs": {}},
    ],
)
def test_from_json_refuses_what_it_did_not_write(raw: dict[str, object]) -> None:
    with pytest.raises((KeyError, TypeError, ValueError)):
        Calibration.from_json(raw)


def test_measured_bandwidth_scales_the_one_rank_prediction() -> None:
    spec = spec_from_config(LLAMA)
    published = plan_local(STUDIO, 1, spec, strategy="tensor")
    half = Calibration(host_bandwidth_gbs=(("localhost", 819.0 / 2),))
    measured = plan_local(STUDIO, 1, spec, strategy="tensor", calibration=half)
    assert published.predicted_decode_tok_s and measured.predicted_decode_tok_s
    ratio = measured.predicted_decode_tok_s / published.predicted_decode_tok_s
    assert ratio == pytest.approx(0.5, rel=1e-3)
    assert any("bench --calibrate" in a for a in measured.assumptions)


def test_a_slow_measured_link_slows_the_tensor_prediction() -> None:
    spec = spec_from_config(LLAMA)
    published = plan_local(STUDIO, 2, spec, strategy="tensor")
    slow = LinkMeasurement("ring-local", 2, SMALL, 2e-3, LARGE, 0.5)
    measured = plan_local(STUDIO, 2, spec, strategy="tensor", calibration=Calibration((slow,)))
    assert published.predicted_decode_tok_s and measured.predicted_decode_tok_s
    assert measured.predicted_decode_tok_s < published.predicted_decode_tok_s / 2
    # A link measured for another backend leaves this plan alone.
    other = Calibration((replace(slow, cost_name="jaccl"),))
    unchanged = plan_local(STUDIO, 2, spec, strategy="tensor", calibration=other)
    assert unchanged.predicted_decode_tok_s == published.predicted_decode_tok_s


def test_notes_name_the_measured_numbers() -> None:
    link = LinkMeasurement("ring", 2, SMALL, 1e-4, LARGE, 5e-2)
    notes = calibration_notes(Calibration((link,), (("a", 99.0),)), ["a", "b"], "ring")
    assert notes[0].startswith("memory bandwidth of a: 99.0 GB/s")
    assert "ring all-reduce cost fitted" in notes[1]
    assert calibration_notes(None, ["a"], "ring") == []


STEPS = StepTimes(layers=8, alone_s=3e-3, tensor_s=13e-3, pipeline_s=4e-3)


@pytest.mark.parametrize(
    ("name", "n", "hops"), [("ring-local", 2, 2), ("ring", 3, 4), ("jaccl", 3, 2)]
)
def test_steps_timed_on_the_mini_model_replace_the_fitted_step_overhead(
    name: str, n: int, hops: int
) -> None:
    """A tensor step's time beyond the whole mini model is its 2 all-reduces a layer: the hop
    is their share of it over the algorithm's hops; a pipeline step's is what it costs beyond
    its stages; and the constant fitted to published Mac runs is no longer added."""
    link = LinkMeasurement(name, n, SMALL, 1e-4, LARGE, 5e-2, STEPS)
    fitted = link.fit(BACKENDS[name])
    assert fitted.in_steps
    assert fitted.hop_s == pytest.approx(10e-3 / 16 / hops)
    assert fitted.pipeline_step_s == pytest.approx(1e-3)
    without = LinkMeasurement(name, n, SMALL, 1e-4, LARGE, 5e-2).fit(BACKENDS[name])
    assert (without.in_steps, without.pipeline_step_s) == (False, None)
    # slower in shares than whole can come out as nothing, never as less
    quick = replace(STEPS, tensor_s=2e-3, pipeline_s=2e-3)
    assert replace(link, steps=quick).fit(BACKENDS[name]).hop_s == 0.0
    assert replace(link, steps=quick).fit(BACKENDS[name]).pipeline_step_s == 0.0


def test_measured_steps_set_what_a_step_adds_to_its_compute() -> None:
    spec = spec_from_config(LLAMA)
    link = LinkMeasurement("ring-local", 2, SMALL, 1e-4, LARGE, 5e-2, STEPS)
    cost = link.fit(BACKENDS["ring-local"])
    message = spec.hidden * 2  # a token's hidden state, as the KV cache's dtype holds it
    assert tensor_comms_s(spec, 2, cost) == pytest.approx(
        2 * spec.layers * cost.all_reduce_s(2, message)
    )  # no step overhead beside the measured hops
    assert tensor_comms_s(spec, 2, BACKENDS["ring-local"]) == pytest.approx(
        2 * spec.layers * BACKENDS["ring-local"].all_reduce_s(2, message) + step_overhead_s(2)
    )
    # a float32 model's ranks exchange 4-byte activations: a prefill chunk's all-reduces of
    # 512 rows carry twice a bfloat16 model's bytes
    f32 = spec_from_config({**LLAMA, "torch_dtype": "float32"})
    assert tensor_comms_s(f32, 2, cost, rows=512) == pytest.approx(
        2 * spec.layers * cost.all_reduce_s(2, 512 * 2 * message)
    )
    calibration = Calibration((link,))
    pipeline = plan_local(STUDIO, 2, spec, strategy="pipeline", calibration=calibration)
    fitted_only = plan_local(
        STUDIO, 2, spec, strategy="pipeline", calibration=Calibration((replace(link, steps=None),))
    )
    gap = 1 / (fitted_only.predicted_decode_tok_s or 1) - 1 / (pipeline.predicted_decode_tok_s or 1)
    # the hand-off and gather hops plus the Mac-fitted overhead give way to the measured 1 ms
    assert gap == pytest.approx(step_overhead_s(2) - 1e-3, abs=2e-4)
    assert any("pipeline step beyond its compute" in a for a in pipeline.assumptions)


def test_step_times_round_trip_and_bad_ones_are_refused() -> None:
    link = LinkMeasurement("ring", 2, SMALL, 1e-4, LARGE, 5e-2, STEPS)
    again = Calibration.from_json(Calibration((link,)).to_json())
    assert again.links == (link,)
    raw = Calibration((link,)).to_json()
    for bad in ({"layers": 0}, {"tensor_s": -1.0}, {"pipeline_s": "1"}):
        broken = {**raw, "links": [{**raw["links"][0], "steps": {**STEPS.to_json(), **bad}}]}
        with pytest.raises((KeyError, TypeError, ValueError)):
            Calibration.from_json(broken)


def test_each_rank_count_is_planned_with_its_own_measurement() -> None:
    """bench --calibrate measures every host count it runs: 2 local tensor ranks on a core
    each wait far less a step than 3 ranks on 2 cores. A plan takes its own count's figures,
    else the largest count's; a merge keeps each count."""
    spec = spec_from_config(LLAMA)
    two = LinkMeasurement("ring-local", 2, SMALL, 1e-4, LARGE, 5e-2)
    three = LinkMeasurement("ring-local", 3, SMALL, 2e-3, LARGE, 0.5)
    both = Calibration((three,)).merged(Calibration((two,)))
    assert set(both.links) == {two, three}
    assert both.link("ring-local", 2) == two and both.link("ring-local", 3) == three
    assert both.link("ring-local", 4) == three and both.link("jaccl", 2) is None

    def tok(calibration: Calibration, n: int) -> float:
        plan = plan_local(STUDIO, n, spec, strategy="tensor", calibration=calibration)
        return plan.predicted_decode_tok_s or 0

    assert tok(both, 2) == tok(Calibration((two,)), 2) > tok(Calibration((three,)), 2)
    assert tok(both, 3) == tok(Calibration((three,)), 3)
    assert any("over 2 ranks" in a for a in calibration_notes(both, ["localhost"], "ring-local", 2))
