"""Plans for the reference models on synthesized Macs (real snapshot text → check → plan)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import synth
from paths import FIXTURES

from topology.chips import GIB, max_wired_bytes
from topology.facts import CheckResult, HostFacts
from topology.model.spec import ModelSpec, spec_from_config
from topology.planning.placement import Slot, split_layers
from topology.planning.plan import Plan, model_problems, plan_cluster, plan_local
from topology.planning.tensor_costs import tensor_layout
from topology.planning.tensor_shares import TensorLayout
from topology.problems import check

LLAMA = "llama-3.3-70b-instruct-bf16"
QWEN_MOE = "qwen3-235b-a22b-4bit"
DEEPSEEK = "deepseek-v3-4bit"
QWEN_DENSE = "qwen3-32b-8bit"


def config(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / "models" / name / "config.json").read_text()))


def spec(name: str, **change: Any) -> ModelSpec:
    return spec_from_config({**config(name), **change}, source=name)


def checked(c: synth.Cluster, backend: str = "auto") -> CheckResult:
    return check(c.facts(), backend)


def codes(plan: Plan, severity: str | None = None) -> list[str]:
    return [p.code for p in plan.problems if severity is None or p.severity == severity]


def test_llama_70b_bf16_tensor_over_4_m3_ultras() -> None:
    plan = plan_cluster(checked(synth.mesh(4)), spec(LLAMA))
    assert plan.ok and plan.strategy == "tensor" and plan.backend == "jaccl"
    assert [r.layers for r in plan.ranks] == [(0, 80)] * 4
    assert "tp_cannot_split" not in codes(plan)
    s = spec(LLAMA)
    quarter = s.weight_bytes / 4
    for r in plan.ranks:  # a quarter of the layers' weights + the full embedding and head
        assert quarter < r.weight_bytes < quarter + s.outside_layers_bytes + 1
        assert r.memory_needed_bytes <= (r.memory_usable_bytes or 0)
    assert plan.predicted_decode_tok_s is not None and plan.roofline_decode_tok_s is not None
    assert 0 < plan.predicted_decode_tok_s < plan.roofline_decode_tok_s


def test_llama_70b_over_3_splits_unevenly_so_auto_picks_tensor() -> None:
    """64 heads and 8 KV heads do not divide by 3: each rank takes a rectangle of the
    8 KV x 8 query-head grid (replicating the KV heads it cuts), faster than pipeline."""
    result = checked(synth.mesh(3))
    plan = plan_cluster(result, spec(LLAMA))
    assert plan.ok and plan.strategy == "tensor" and plan.world_size == 3
    assert plan.backend == "jaccl" and codes(plan) == []
    assert plan.reason.startswith("tensor over 3 is fastest")
    assert plan.reason.endswith("for pipeline")
    assert [r.layers for r in plan.ranks] == [(0, 80)] * 3 and plan.layer_split is None
    summaries = [r.share_summary for r in plan.ranks]
    assert sum(s["heads"] for s in summaries) == 64  # every query head on exactly one rank
    assert max(s["heads"] for s in summaries) - min(s["heads"] for s in summaries) <= 8
    assert sum(s["mlp_width"] for s in summaries) == 28672  # bf16: any column is a cut
    assert max(s["mlp_width"] for s in summaries) - min(s["mlp_width"] for s in summaries) <= 1
    # 8 KV heads over 3 ranks: at least one is held by two ranks (more than 8 held in all)
    assert sum(s["kv_heads"] for s in summaries) > 8
    assert any(s["kv_replicated"] for s in summaries)
    for r in plan.ranks:
        assert r.tensor_share is not None and r.read_bytes_per_token > 0
        assert r.predicted_step_s > 0 and r.memory_needed_bytes <= (r.memory_usable_bytes or 0)
    assert plan.predicted_decode_tok_s is not None
    # the rank with the longest step sets the pace
    slowest = max(r.predicted_step_s for r in plan.ranks)
    assert plan.predicted_decode_tok_s == pytest.approx(1 / slowest, rel=0.01)
    pipeline = plan_cluster(result, spec(LLAMA), strategy="pipeline")
    assert pipeline.ok and pipeline.predicted_decode_tok_s is not None
    assert plan.predicted_decode_tok_s > 1.5 * pipeline.predicted_decode_tok_s
    split = pipeline.layer_split
    assert split is not None and sum(split) == 80 and min(split) >= 1
    # mlx-lm's order: rank 0 holds the LAST layers, the last rank the first ones.
    assert pipeline.ranks[0].layers[1] == 80 and pipeline.ranks[-1].layers[0] == 0
    for a, b in zip(pipeline.ranks, pipeline.ranks[1:], strict=False):
        assert b.layers[1] == a.layers[0]
    forced = plan_cluster(result, spec(LLAMA), strategy="tensor")
    assert forced.ok and forced.to_json() == plan.to_json() | {"reason": forced.reason}


def test_forced_tensor_over_more_ranks_than_heads_cannot_split() -> None:
    few = spec(LLAMA, num_attention_heads=2, num_key_value_heads=2)
    result = checked(synth.mesh(3))
    forced = plan_cluster(result, few, strategy="tensor")
    assert not forced.ok and forced.ranks == ()
    [bad] = [p for p in forced.problems if p.code == "tp_cannot_split"]
    assert bad.severity == "error"
    assert bad.message == (
        "tensor parallel over 3 ranks needs at least 3 attention heads (the model has 2)"
    )
    assert bad.fix == "Use at most 2 hosts for tensor parallel, or `--strategy pipeline`."
    auto = plan_cluster(result, few)
    assert auto.ok and auto.strategy == "pipeline"
    assert auto.reason.startswith("tensor over 3 would need at least 3 attention heads")
    assert codes(auto, "warning") == ["tp_cannot_split"]


def test_qwen3_235b_has_4_kv_heads_and_tensor_over_8_replicates_them() -> None:
    result = checked(synth.ring(8))  # 8 M3 Ultras can't form a full mesh (6 ports): a ring
    assert result.backend == "jaccl-ring"
    forced = plan_cluster(result, spec(QWEN_MOE), strategy="tensor")
    assert forced.ok and forced.strategy == "tensor" and forced.backend == "jaccl-ring"
    assert not any(c.startswith("tp_") for c in codes(forced))
    shares = [r.tensor_share for r in forced.ranks]
    summaries = [r.share_summary for r in forced.ranks]
    # 4 KV heads x 16 query heads each: every rank holds one KV head and half its queries
    assert [s["heads"] for s in summaries] == [8] * 8
    assert [s["kv_heads"] for s in summaries] == [1] * 8
    assert all(s["kv_replicated"] for s in summaries)
    assert sorted(tuple(b) for s in shares if s for b in s["attention"]) == [
        (k, k + 1, *c) for k in range(4) for c in ((0, 8), (8, 16))
    ]
    # 1536 expert columns = 24 groups of 64: 3 groups each, back to back
    assert [tuple(s["expert"]) for s in shares if s] == [(192 * i, 192 * (i + 1)) for i in range(8)]
    auto = plan_cluster(result, spec(QWEN_MOE))
    assert auto.ok and auto.backend == "jaccl-ring"
    assert not any(c.startswith("tp_") for c in codes(auto))
    # both strategies are valid now: auto takes the faster prediction over the ring
    pipeline = plan_cluster(result, spec(QWEN_MOE), strategy="pipeline")
    speeds = {p.strategy: p.predicted_decode_tok_s or 0.0 for p in (forced, pipeline)}
    assert auto.strategy == max(speeds, key=lambda k: speeds[k])
    assert auto.predicted_decode_tok_s == speeds[auto.strategy]
    other = "pipeline" if auto.strategy == "tensor" else "tensor"
    assert f"vs {speeds[other]:.1f} for {other}" in auto.reason
    over_4 = plan_cluster(checked(synth.mesh(4)), spec(QWEN_MOE))
    assert over_4.ok and over_4.strategy == "tensor"


def test_deepseek_v3_does_not_fit_one_256gb_ultra_but_fits_tensor_over_two_512gb() -> None:
    small = plan_cluster(checked(synth.cluster(1, memory_gb=256)), spec(DEEPSEEK))
    assert not small.ok and codes(small, "error") == ["model_does_not_fit"]
    problem = small.problems[0]
    assert "192 GiB usable of 256 GiB" in problem.message
    assert "more hosts" in problem.fix and "3-bit" in problem.fix
    assert "wired_limit_mb" not in problem.fix  # 352 GiB can never be wired on a 256 GiB Mac
    two = plan_cluster(checked(synth.mesh(2)), spec(DEEPSEEK))
    assert two.ok and two.strategy == "tensor" and two.world_size == 2
    # MLA: the latent KV cache is not split across tensor ranks.
    assert two.ranks[0].kv_cache_bytes == spec(DEEPSEEK).kv_bytes_per_token * 4096


def test_wired_limit_fix_is_concrete_and_makes_it_fit() -> None:
    c = synth.mesh(2, memory_gb=192)
    plan = plan_cluster(check(c.facts()), spec(DEEPSEEK), strategy="tensor")
    assert not plan.ok
    fix = next(p for p in plan.problems if p.code == "model_does_not_fit").fix
    assert fix.count("sudo sysctl iogpu.wired_limit_mb=") == 2
    mb = int(fix.split("iogpu.wired_limit_mb=")[1].split("`")[0])
    assert mb * (1 << 20) <= max_wired_bytes(192 * GIB)
    raised = tuple(dataclasses.replace(h, wired_limit_bytes=mb << 20) for h in c.facts())
    fixed = plan_cluster(check(raised), spec(DEEPSEEK), strategy="tensor")
    assert fixed.ok, fixed.problems


def mixed_macs() -> synth.Cluster:
    c = synth.Cluster(
        [
            synth.SynthHost("studio", "m3-ultra"),
            synth.SynthHost("max", "m4-max"),
            synth.SynthHost("mini", "m4-pro-mini"),
        ]
    )
    for a, b in (("studio", "max"), ("max", "mini"), ("mini", "studio")):
        c.cable(a, b)
    return c


def test_tensor_shares_follow_bandwidth_on_mixed_macs() -> None:
    plan = plan_cluster(check(mixed_macs().facts()), spec(QWEN_MOE))
    assert plan.ok and plan.strategy == "tensor" and codes(plan) == []
    pipeline = plan_cluster(check(mixed_macs().facts()), spec(QWEN_MOE), strategy="pipeline")
    assert (plan.predicted_decode_tok_s or 0) > (pipeline.predicted_decode_tok_s or 0) > 0
    assert plan.reason.startswith("tensor over 3 is fastest")
    assert {r.host: r.bandwidth_gbs for r in plan.ranks} == {"studio": 819, "max": 546, "mini": 273}
    s = {r.host: r.share_summary for r in plan.ranks}
    assert s["studio"]["heads"] > s["max"]["heads"] > s["mini"]["heads"] >= 1
    assert s["studio"]["expert_width"] > s["max"]["expert_width"] > s["mini"]["expert_width"]
    assert sum(v["heads"] for v in s.values()) == 64
    assert sum(v["expert_width"] for v in s.values()) == 1536
    # 819 : 546 : 273 GB/s is 3 : 2 : 1, and 24 groups of 64 columns split exactly so
    assert [s[h]["expert_width"] for h in ("studio", "max", "mini")] == [768, 512, 256]
    for r in plan.ranks:
        assert r.memory_needed_bytes <= (r.memory_usable_bytes or 0)


def test_pipeline_splits_in_proportion_to_memory_on_mixed_macs() -> None:
    c = mixed_macs()
    plan = plan_cluster(check(c.facts()), spec(QWEN_MOE), strategy="pipeline")
    assert plan.ok and plan.strategy == "pipeline"
    counts = {r.host: r.layers[1] - r.layers[0] for r in plan.ranks}
    assert counts["studio"] > counts["max"] > counts["mini"] >= 1
    for r in plan.ranks:
        assert r.memory_needed_bytes <= (r.memory_usable_bytes or 0)
    assert {r.host: r.bandwidth_gbs for r in plan.ranks} == {"studio": 819, "max": 546, "mini": 273}


def test_split_gives_every_rank_a_layer_and_falls_back_to_greedy_fill() -> None:
    s = spec(QWEN_DENSE)
    slots = [Slot(f"h{i}", f"h{i}", 40 * GIB, 64 * GIB, 273.0) for i in range(4)]
    split = split_layers(s, slots, 4096)
    assert sum(split) == 64 and len(split) == 4 and min(split) >= 1
    lopsided = [Slot("big", "big", 400 * GIB, 512 * GIB, 819.0), *slots[:2]]
    split = split_layers(s, lopsided, 4096)
    assert split[0] > split[1] and min(split) >= 1


def test_group_size_rule_for_quantized_tensor_parallel() -> None:
    # 12352 = 193 groups of 64: no even split, but 97 + 96 whole groups
    s = spec(QWEN_DENSE, intermediate_size=12352)
    lay = tensor_layout(s, [1.0, 1.0], 4096)
    assert isinstance(lay, TensorLayout)
    assert [share.widths["mlp"] for share in lay.shares] == [(0, 97 * 64), (97 * 64, 12352)]
    plan = plan_cluster(checked(synth.mesh(2)), s, strategy="tensor")
    assert plan.ok and [r.share_summary["mlp_width"] for r in plan.ranks] == [6208, 6144]
    # a quantized width of fewer groups than ranks cannot be cut in whole groups
    narrow = spec(QWEN_DENSE, intermediate_size=128)  # 2 groups of 64
    refused = plan_cluster(checked(synth.mesh(3)), narrow, strategy="tensor")
    assert not refused.ok and codes(refused, "error") == ["tp_cannot_split"]
    assert refused.problems[0].message == (
        "tensor parallel over 3 ranks needs mlp width 128 in at least 3 pieces of 64 columns"
    )
    assert "--strategy pipeline" in refused.problems[0].fix
    assert plan_cluster(checked(synth.mesh(2)), narrow, strategy="tensor").ok  # 1 group each
    # unquantized, any column is a cut
    unquantized = {k: v for k, v in config(QWEN_DENSE).items() if k != "quantization"}
    bf16 = spec_from_config({**unquantized, "intermediate_size": 128})
    lay = tensor_layout(bf16, [1.0, 1.0, 1.0], 4096)
    assert isinstance(lay, TensorLayout)
    assert [share.width("mlp") for share in lay.shares] == [43, 43, 42]


def test_model_without_tensor_parallel_in_mlx_lm_uses_pipeline() -> None:
    plan = plan_cluster(checked(synth.mesh(2)), spec(QWEN_DENSE, model_type="mixtral_like"))
    assert plan.ok and plan.strategy == "pipeline"
    assert "tp_unsupported" in codes(plan, "warning")


def test_prediction_follows_the_physics() -> None:
    qwen = spec(QWEN_MOE)
    one = plan_cluster(checked(synth.cluster(1)), qwen)
    two = plan_cluster(checked(synth.mesh(2)), qwen, strategy="tensor")
    tcp = plan_cluster(checked(synth.mesh(2), "ring"), qwen, strategy="tensor", backend="ring")
    pipe = plan_cluster(checked(synth.mesh(2)), qwen, strategy="pipeline")
    speeds = [p.predicted_decode_tok_s or 0.0 for p in (one, two, tcp, pipe)]
    assert all(p.ok for p in (one, two, tcp, pipe))
    assert speeds[1] > speeds[0] > speeds[3]  # tensor scales; pipeline adds hops, no speed
    assert speeds[2] < speeds[1] / 2  # TCP collectives cost far more than RDMA ones
    for p in (one, two, tcp, pipe):
        assert (p.predicted_decode_tok_s or 0) <= (p.roofline_decode_tok_s or 0)


def test_exo_figures_are_reproduced_within_5_percent() -> None:
    """The fitted constants reproduce the published 4× M3 Ultra runs (RDMA, tensor)."""
    qwen8 = spec(QWEN_MOE, quantization={"bits": 8, "group_size": 64})
    for model, published in ((qwen8, (19.5, 26.2, 31.9)), (spec(DEEPSEEK), (21.1, 27.8, 32.5))):
        for n, figure in zip((1, 2, 4), published, strict=True):
            plan = plan_cluster(checked(synth.mesh(n)), model, strategy="tensor", context=512)
            assert plan.predicted_decode_tok_s == pytest.approx(figure, rel=0.05)


def test_ring_backend_orders_ranks_around_the_cabled_ring() -> None:
    c = synth.cluster(4, rdma=False)
    for a, b in (
        ("studio-a", "studio-c"),
        ("studio-c", "studio-b"),
        ("studio-b", "studio-d"),
        ("studio-d", "studio-a"),
    ):
        c.cable(a, b)
    result = check(c.facts(), "ring")
    plan = plan_cluster(result, spec(QWEN_MOE), backend="ring")
    assert plan.ok and [r.host for r in plan.ranks] == [
        "studio-a",
        "studio-c",
        "studio-b",
        "studio-d",
    ]
    facts = {h.name: h for h in result.hosts}
    for i, r in enumerate(plan.ranks):
        left = plan.ranks[i - 1].host
        cable = next(k for k in result.links if {k.a, k.b} == {r.host, left})
        iface = cable.iface_of(r.host)
        assert iface is not None
        assert r.ip in [a.ip for a in facts[r.host].addrs_of(iface)]  # its /30 on that cable


def test_jaccl_without_a_coordinator_address_is_refused() -> None:
    plan = plan_cluster(checked(synth.mesh(2, lan_ip=None)), spec(QWEN_DENSE))
    assert not plan.ok and "no_rank_address" in codes(plan, "error")
    with_ips = synth.mesh(2, lan_ip=None)
    with_ips.hosts[0].ips = ("10.1.0.1",)
    plan = plan_cluster(checked(with_ips), spec(QWEN_DENSE))
    assert plan.ok and plan.ranks[0].ip == "10.1.0.1"


def test_broken_cluster_blocks_a_forced_backend_but_auto_falls_back() -> None:
    c = synth.mesh(3)
    c.host("studio-b").rdma = False
    forced = plan_cluster(check(c.facts(), "jaccl"), spec(QWEN_MOE), backend="jaccl")
    assert not forced.ok and "rdma_disabled" in codes(forced, "error")
    auto = plan_cluster(check(c.facts()), spec(QWEN_MOE))
    assert auto.ok and auto.backend == "ring" and "rdma_disabled" in codes(auto, "warning")


def test_local_ranks_share_this_machine() -> None:
    me = HostFacts(name="localhost", ssh="127.0.0.1", memory_bytes=64 * GIB, chip="Apple M4 Max")
    plan = plan_local(me, 2, spec(QWEN_DENSE), strategy="tensor")
    assert plan.ok and plan.local and plan.backend == "ring" and plan.strategy == "tensor"
    assert [r.ip for r in plan.ranks] == ["127.0.0.1", "127.0.0.1"]
    assert [r.memory_usable_bytes for r in plan.ranks] == [24 * GIB, 24 * GIB]  # 75% of 64, /2
    assert [r.bandwidth_gbs for r in plan.ranks] == [273.0, 273.0]  # 546 GB/s shared
    # pipeline stages take turns: the one reading its layers has all 546 GB/s
    staged = plan_local(me, 2, spec(QWEN_DENSE), strategy="pipeline")
    assert [r.bandwidth_gbs for r in staged.ranks] == [546.0, 546.0]
    assert [r.memory_usable_bytes for r in staged.ranks] == [24 * GIB, 24 * GIB]
    one = plan_local(me, 1, spec(QWEN_DENSE)).predicted_decode_tok_s or 0
    assert 0.8 * one < (staged.predicted_decode_tok_s or 0) < one
    unknown = plan_local(HostFacts(name="localhost", memory_bytes=64 * GIB), 1, spec(QWEN_DENSE))
    assert any("assumed" in a for a in unknown.assumptions)
    with pytest.raises(ValueError):
        plan_local(me, 0, spec(QWEN_DENSE))


def test_model_problems_for_topology_check() -> None:
    assert model_problems(checked(synth.mesh(4)), spec(LLAMA), 4096) == []
    assert model_problems(checked(synth.mesh(3)), spec(LLAMA), 4096) == []
    big = model_problems(checked(synth.cluster(1, memory_gb=256)), spec(DEEPSEEK), 4096)
    assert [(p.code, p.severity) for p in big] == [("model_does_not_fit", "error")]
    assert model_problems(checked(synth.mesh(3)), spec(LLAMA), 4096, strategy="tensor") == []
    few = spec(LLAMA, num_attention_heads=2, num_key_value_heads=2)
    over_3 = model_problems(checked(synth.mesh(3)), few, 4096)
    assert [(p.code, p.severity) for p in over_3] == [("tp_cannot_split", "warning")]
    strict = model_problems(checked(synth.mesh(3)), few, 4096, strategy="tensor")
    assert [(p.code, p.severity) for p in strict] == [("tp_cannot_split", "error")]


def test_plan_json_round_trips_with_the_contract_fields() -> None:
    plan = plan_cluster(checked(synth.mesh(3)), spec(LLAMA), strategy="pipeline")
    raw = json.loads(json.dumps(plan.to_json()))
    for key in ("strategy", "backend", "ranks", "predicted_decode_tok_s", "reason", "problems"):
        assert key in raw
    assert set(raw["ranks"][0]) >= {"rank", "host", "layers", "ip", "memory_needed_bytes"}
    assert raw["layer_split"] == list(plan.layer_split or ())
    assert "tensor_share" not in raw["ranks"][0]  # pipeline ranks hold whole layers
    assert Plan.from_json(raw) == plan
    # a tensor plan (auto over 3 now) also says what each rank holds and reads
    tensor = json.loads(json.dumps(plan_cluster(checked(synth.mesh(3)), spec(LLAMA)).to_json()))
    assert tensor["strategy"] == "tensor" and tensor["layer_split"] is None
    for r in tensor["ranks"]:
        assert set(r) >= {"rank", "host", "layers", "ip", "memory_needed_bytes", "tensor_share"}
        assert set(r) >= {"heads", "kv_heads", "kv_replicated", "mlp_width"}
        assert set(r) >= {"read_bytes_per_token", "predicted_step_s"}
    assert Plan.from_json(tensor).ranks[0].tensor_share == tensor["ranks"][0]["tensor_share"]


def test_linux_hosts_plan_over_ring_with_their_addresses() -> None:
    c = synth.cluster(2, linux=True)
    plan = plan_cluster(check(c.facts()), spec(QWEN_DENSE))
    assert plan.ok and plan.backend == "ring"
    assert [r.ip for r in plan.ranks] == ["10.9.0.10", "10.9.0.11"]  # eth0, same subnet
    assert any("not a Mac" in a and "not checked" in a for a in plan.assumptions)


def test_point_to_point_ips_pick_the_cable_to_the_left_neighbour() -> None:
    """Linux hosts cabled in a triangle, /30 per cable, known only from the cluster file's ips."""
    c = synth.cluster(3, linux=True)
    c.hosts[0].ips = ("10.0.0.1", "10.0.2.2")  # a-b, c-a
    c.hosts[1].ips = ("10.0.0.2", "10.0.1.1")  # a-b, b-c
    c.hosts[2].ips = ("10.0.1.2", "10.0.2.1")  # b-c, c-a
    plan = plan_cluster(check(c.facts(), "ring"), spec(QWEN_DENSE), backend="ring")
    assert plan.ok
    assert [r.ip for r in plan.ranks] == ["10.0.2.2", "10.0.0.2", "10.0.1.2"]
