"""The Calibration the planner takes from `bench --calibrate`: fitting, JSON, and its effect."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from topology.chips import BACKENDS, GIB, BackendCost
from topology.facts import HostFacts
from topology.model.spec import spec_from_config
from topology.planning.calibration import Calibration, LinkMeasurement, calibration_notes
from topology.planning.plan import plan_local

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
