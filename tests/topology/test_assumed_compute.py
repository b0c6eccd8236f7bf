"""A Mac never measured (no rates.json) gets its GPU's matmul rate from the chip table: prefill
and time to first token are predicted, decode is not changed, a measured rates.json wins, and
the plan says what it assumed (text and plan --json)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import synth
from paths import FIXTURES

from topology import chips
from topology.chips import GIB, assumed_rates, gpu_chip
from topology.facts import CheckResult, HostFacts
from topology.host_rates import HostRates, parse_rates
from topology.model.spec import ModelSpec, spec_from_config
from topology.planning import plan as planning
from topology.planning.plan import Plan, plan_cluster, plan_local
from topology.planning.report import plan_text
from topology.problems import check

MODELS = ("llama-3.3-70b-instruct-bf16", "qwen3-235b-a22b-4bit", "deepseek-v3-4bit")
QWEN_DENSE = "qwen3-32b-8bit"


def spec(name: str) -> ModelSpec:
    raw = json.loads((FIXTURES / "models" / name / "config.json").read_text())
    return spec_from_config(raw, source=name)


def mesh(n: int = 3, preset: str = "m3-ultra") -> CheckResult:
    return check(synth.mesh(n, preset).facts(), "auto")


def with_hosts(c: CheckResult, **change: Any) -> CheckResult:
    return dataclasses.replace(c, hosts=tuple(dataclasses.replace(h, **change) for h in c.hosts))


@pytest.mark.parametrize(
    ("chip", "memory_gb", "cores"),
    [
        ("Apple M3 Ultra", 512, 80),  # 512 GB ships only with the 80-core GPU
        ("Apple M3 Ultra", 96, 60),
        ("Apple M3 Ultra", 256, 60),  # both bins ship with 256 GB: the cut-down one
        ("Apple M3 Max", 36, 30),
        ("Apple M3 Max", 48, 40),
        ("Apple M4 Max", 36, 32),
        ("Apple M4 Max", 128, 40),
        ("Apple M2 Ultra", 192, 76),
        ("Apple M1 Ultra", 64, 48),
        ("Apple M1", 16, 8),
        ("Apple M5 Max", 128, 40),
    ],
)
def test_the_chip_table_picks_the_bin_by_memory(chip: str, memory_gb: int, cores: int) -> None:
    gpu = gpu_chip(chip, memory_gb * GIB)
    assert gpu is not None and gpu.cores == cores
    # cores x 128 ALUs x 2 FLOPs x the clock: an M3 Ultra's 80 cores at 1.398 GHz = 28.6 TFLOP/s
    assert gpu.peak_tflops == pytest.approx(cores * 256 * gpu.clock_ghz / 1e3)


def test_the_table_covers_every_family_and_not_other_chips() -> None:
    for family in ("M1", "M2", "M3", "M4", "M5"):
        for tier in ("", " Pro", " Max"):
            assert gpu_chip(f"Apple {family}{tier}", 64 * GIB) is not None, family + tier
    assert gpu_chip("Apple M3 Ultra", 512 * GIB) is not None
    assert gpu_chip("Intel(R) Xeon(R)", 64 * GIB) is None and gpu_chip(None, None) is None
    not_a_mac = HostFacts(name="box", chip="Apple M3 Ultra", memory_bytes=512 * GIB, is_mac=False)
    assert assumed_rates(not_a_mac) is None


def test_assumed_rates_are_a_flat_512_row_figure_per_kind() -> None:
    rates = assumed_rates(HostFacts(name="a", chip="Apple M3 Ultra", memory_bytes=512 * GIB))
    assert rates is not None and rates.source == "assumed" and rates.device == "gpu"
    q4 = rates.gflops("q4", 512)
    # an 80-core M3 Ultra at the assumed 4-bit efficiency: about 23 TFLOP/s
    assert q4 is not None and 18_000 < q4 < 26_000
    assert rates.gflops("q4", 8) == q4  # flat below 512 rows
    assert rates.gflops("q4", 1) is None  # a decode step keeps its memory-only time
    assert (rates.gflops("bfloat16", 512) or 0) > q4 > (rates.gflops("float32", 512) or 0)
    # M1 has no bfloat16 arithmetic: its bfloat16 tiles run slower than float16
    m1 = assumed_rates(HostFacts(name="b", chip="Apple M1 Max", memory_bytes=64 * GIB))
    assert m1 is not None and (m1.gflops("bfloat16", 512) or 0) < (m1.gflops("float16", 512) or 0)


def test_an_unmeasured_m3_ultra_cluster_has_a_time_to_first_token() -> None:
    c, s = mesh(3), spec(QWEN_DENSE)
    ttfts = []
    for prompt in (1024, 4096, 16384):
        plan = plan_cluster(c, s, prompt_tokens=prompt)
        assert plan.predicted_ttft_s is not None and plan.compute_source == "assumed"
        ttfts.append(plan.predicted_ttft_s)
        # 3 M3 Ultras on a 32B 8-bit model: hundreds of tokens a second, not thousands
        assert 200 < (plan.predicted_prefill_tok_s or 0) < 3000
    # about linear in the prompt (attention over a longer context adds a little)
    assert 3.5 < ttfts[1] / ttfts[0] < 5 and 3.5 < ttfts[2] / ttfts[1] < 5.5


def test_a_measured_rates_json_wins_over_the_table() -> None:
    measured = HostRates(819.0, {"q8": {1: 500.0, 8: 4000.0, 512: 5000.0}}, device="gpu")
    s = spec(QWEN_DENSE)
    table = plan_cluster(mesh(3), s)
    plan = plan_cluster(with_hosts(mesh(3), rates=measured), s)
    assert plan.compute_source == "measured"
    # 5 TFLOP/s measured against the table's ~22: prefill is several times slower
    assert (plan.predicted_ttft_s or 0) > 3 * (table.predicted_ttft_s or 0)
    assert not any("chip table" in a for a in plan.assumptions)
    one = dataclasses.replace(mesh(3).hosts[0], rates=measured)
    mixed = plan_cluster(dataclasses.replace(mesh(3), hosts=(one, *mesh(3).hosts[1:])), s)
    assert mixed.compute_source == "mixed"
    assert "measured on some hosts, assumed" in plan_text(mixed)


@pytest.mark.parametrize("name", [*MODELS, QWEN_DENSE])
@pytest.mark.parametrize("context", [4096, 131072])
def test_decode_is_unchanged_by_assumed_rates(
    name: str, context: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = spec(name)
    context = min(context, s.max_context or context)
    clusters = [mesh(3), mesh(2, "m4-max"), mesh(4)]
    with_table = [plan_cluster(c, s, context=context) for c in clusters]
    monkeypatch.setattr(planning, "assumed_rates", lambda h: None)  # the planner before the table
    without = [plan_cluster(c, s, context=context) for c in clusters]
    for a, b in zip(with_table, without, strict=True):
        assert a.strategy == b.strategy and a.predicted_decode_tok_s == b.predicted_decode_tok_s
        assert [r.predicted_step_s for r in a.ranks] == [r.predicted_step_s for r in b.ranks]
        assert [r.tensor_share for r in a.ranks] == [r.tensor_share for r in b.ranks]
        assert b.predicted_ttft_s is None and (a.predicted_ttft_s is not None or not a.ok)


def test_the_plan_says_what_it_assumed() -> None:
    plan = plan_cluster(mesh(3), spec(QWEN_DENSE))
    [note] = [a for a in plan.assumptions if "compute of" in a]
    assert note.startswith("compute of studio-a, studio-b, studio-c not measured: M3 Ultra")
    assert "80-core GPU" in note and "q8 matmul assumed at 23.5 TFLOP/s from the chip table" in note
    assert "mlx-cluster topology check" in note
    text = plan_text(plan)
    assert "first token after" in text and "(compute assumed from the chip table" in text
    # a host the table does not know keeps the old line and gets no prefill figure
    odd = plan_cluster(with_hosts(mesh(3), chip="Apple M9 Hyper"), spec(QWEN_DENSE))
    assert odd.predicted_ttft_s is None and odd.compute_source is None
    assert any("not measured (no rates.json)" in a for a in odd.assumptions)
    assert "Predicted prefill: not predicted" in plan_text(odd)


def test_plan_json_carries_the_compute_source() -> None:
    plan = plan_cluster(mesh(3), spec(QWEN_DENSE))
    raw = plan.to_json()
    assert raw["compute_source"] == "assumed" and raw["predicted_ttft_s"] == plan.predicted_ttft_s
    again = Plan.from_json(json.loads(json.dumps(raw)))
    assert again.compute_source == "assumed"
    assert Plan.from_json({**raw, "compute_source": None}).compute_source is None
    del raw["compute_source"]  # a plan.json written before the field
    assert Plan.from_json(raw).compute_source is None
    with pytest.raises(ValueError, match="compute_source"):
        Plan.from_json({**plan.to_json(), "compute_source": "guessed"})


def test_a_linux_host_is_still_planned_by_memory_alone() -> None:
    host = HostFacts(name="localhost", memory_bytes=16 * GIB, is_mac=False)
    plan = plan_local(host, 1, _tiny())
    assert plan.predicted_ttft_s is None and plan.compute_source is None


def test_a_local_mac_never_measured_gets_the_table_too() -> None:
    host = HostFacts(name="localhost", chip="Apple M4 Max", memory_bytes=128 * GIB)
    plan = plan_local(host, 1, _tiny())
    assert plan.compute_source == "assumed" and plan.predicted_ttft_s is not None
    measured = parse_rates(json.dumps({"copy_gbs": 400, "matmul_gflops": {"float32": {"512": 9}}}))
    again = plan_local(dataclasses.replace(host, rates=measured), 1, _tiny())
    assert again.compute_source == "measured"
    assert chips.PREFILL_ROWS == 512


def _tiny() -> ModelSpec:
    return spec_from_config(
        {
            "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
            "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
            "vocab_size": 49152, "tie_word_embeddings": True, "torch_dtype": "float32",
        }
    )  # fmt: skip
