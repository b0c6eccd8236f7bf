"""The prefix cache budget `serve` gives the ranks: bytes from the plan's headroom, turned into
tokens on the rank that holds the most KV bytes per token (reference models, synthesized Macs)."""

from __future__ import annotations

import dataclasses
import json

import synth
from paths import FIXTURES

from topology.chips import GIB
from topology.model.spec import ModelSpec, spec_from_config
from topology.planning.plan import Plan, plan_cluster
from topology.planning.serving import (
    MAX_DEFAULT_BYTES,
    UNKNOWN_MEMORY_BYTES,
    default_prefix_cache_bytes,
    headroom_bytes,
    prefix_cache_budget,
    rank_kv_bytes_per_token,
)
from topology.problems import check

LLAMA = "llama-3.3-70b-instruct-bf16"  # 80 layers, 8 KV heads × 128: 4096 B per token and layer
DEEPSEEK = "deepseek-v3-4bit"  # MLA: the latent is not split over tensor ranks
QWEN_DENSE = "qwen3-32b-8bit"


def spec(name: str) -> ModelSpec:
    config = json.loads((FIXTURES / "models" / name / "config.json").read_text())
    return spec_from_config(config, source=name)


def plan(cluster: synth.Cluster, name: str, strategy: str = "auto") -> Plan:
    result = plan_cluster(check(cluster.facts(), "auto"), spec(name), strategy=strategy)
    assert result.ok, result.reason
    return result


def test_tensor_splits_the_kv_cache_and_the_default_is_capped() -> None:
    p, s = plan(synth.mesh(4), LLAMA, "tensor"), spec(LLAMA)
    assert s.kv_bytes_per_token_per_layer == 4096
    assert [rank_kv_bytes_per_token(p, r, s) for r in p.ranks] == [4096 * 80 // 4] * 4
    assert min(h or 0 for h in map(headroom_bytes, p.ranks)) > 2 * MAX_DEFAULT_BYTES
    budget = prefix_cache_budget(p, s, None)
    assert (budget.bytes, budget.kv_bytes_per_token) == (MAX_DEFAULT_BYTES, 81920)
    assert budget.tokens == 8 * GIB // 81920


def test_uneven_tensor_counts_tokens_on_the_rank_with_the_most_kv_heads() -> None:
    """Over 3 ranks the 8 KV heads split 3 / 3 / 2 (or with replicas): each rank's own heads."""
    p, s = plan(synth.mesh(3), LLAMA), spec(LLAMA)
    assert p.strategy == "tensor"
    held = [int(r.share_summary["kv_heads"]) for r in p.ranks]
    per_head = 2 * 128 * 2 * 80  # keys and values, bf16, every layer
    assert [rank_kv_bytes_per_token(p, r, s) for r in p.ranks] == [k * per_head for k in held]
    budget = prefix_cache_budget(p, s, 2 * GIB)
    assert budget.kv_bytes_per_token == max(held) * per_head


def test_pipeline_counts_tokens_on_the_rank_with_the_most_layers() -> None:
    p, s = plan(synth.mesh(3), LLAMA, "pipeline"), spec(LLAMA)
    assert p.strategy == "pipeline"
    most = max(r.layers[1] - r.layers[0] for r in p.ranks)
    assert most < 80
    budget = prefix_cache_budget(p, s, 2 * GIB)
    assert budget.kv_bytes_per_token == 4096 * most
    assert budget.tokens == 2 * GIB // (4096 * most)
    for r in p.ranks:  # every rank holds the same tokens within the byte budget
        assert budget.tokens * rank_kv_bytes_per_token(p, r, s) <= 2 * GIB


def test_mla_latent_is_whole_on_every_tensor_rank() -> None:
    p, s = plan(synth.mesh(2), DEEPSEEK, "tensor"), spec(DEEPSEEK)
    assert s.is_mla
    per_token = s.kv_bytes_per_token_per_layer * s.layers
    assert [rank_kv_bytes_per_token(p, r, s) for r in p.ranks] == [per_token] * 2
    assert prefix_cache_budget(p, s, GIB).tokens == GIB // per_token


def test_zero_turns_the_cache_off_and_an_explicit_size_ignores_the_headroom() -> None:
    p, s = plan(synth.mesh(2), QWEN_DENSE, "tensor"), spec(QWEN_DENSE)
    off = prefix_cache_budget(p, s, 0)
    assert (off.bytes, off.tokens) == (0, 0)
    big = prefix_cache_budget(p, s, 100 * GIB)
    assert big.bytes == 100 * GIB and big.tokens == 100 * GIB // big.kv_bytes_per_token


def test_default_is_half_the_tightest_headroom_and_never_negative() -> None:
    p = plan(synth.mesh(2), QWEN_DENSE, "tensor")
    first, second = p.ranks
    tight = dataclasses.replace(second, memory_usable_bytes=second.memory_needed_bytes + 3 * GIB)
    assert default_prefix_cache_bytes(dataclasses.replace(p, ranks=(first, tight))) == 3 * GIB // 2
    over = dataclasses.replace(second, memory_usable_bytes=second.memory_needed_bytes - GIB)
    assert headroom_bytes(over) == 0
    assert default_prefix_cache_bytes(dataclasses.replace(p, ranks=(first, over))) == 0


def test_unknown_memory_is_left_out_or_gets_a_modest_guess() -> None:
    p = plan(synth.mesh(2), QWEN_DENSE, "tensor")
    first, second = p.ranks
    one_unknown = dataclasses.replace(
        p, ranks=(first, dataclasses.replace(second, memory_usable_bytes=None))
    )
    half = (headroom_bytes(first) or 0) // 2
    assert default_prefix_cache_bytes(one_unknown) == min(MAX_DEFAULT_BYTES, half)
    ranks = tuple(dataclasses.replace(r, memory_usable_bytes=None) for r in p.ranks)
    none_known = dataclasses.replace(p, ranks=ranks)
    assert default_prefix_cache_bytes(none_known) == UNKNOWN_MEMORY_BYTES
