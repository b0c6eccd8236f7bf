"""KV memory admission on real ranks (`serve --local 2`, default flags), under a deliberately
small memory: this machine's wired limit set through the test-only MLX_CLUSTER_TEST_WIRED_LIMIT_MB
so each rank has 2 MiB beyond what the plan needs. Many long requests at once, from the official
`openai` and `anthropic` clients: all finish, requests wait for memory rather than a count, and
no rank's MLX peak memory grows past what the plan leaves for KV caches. Admission by count alone
(measured while writing this test) grows each rank by 67 MiB against an 18 MiB budget."""

from __future__ import annotations

import http.client
import json
import math
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from launch_helpers import MLX_CLUSTER, ROOT
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import Server, serving

from cluster.tiny_model import write_tiny_model
from launcher.planning.cluster_plan import TEST_WIRED_LIMIT_ENV

CONTEXT = 2048  # the model's max_position_embeddings: the plan reserves KV for this much
EXTRA_MB = 2  # per rank, beyond what the plan needs: the prefix cache takes half of it
LONG = 300  # max_tokens of the burst: prompt + 300 → 512 positions per row
EOS = "2"  # the tiny tokenizer's end of sequence, biased away so every request runs to LONG


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose KV dominates its memory: 8 layers × 8 KV heads × 32, float32."""
    path = write_tiny_model(
        tmp_path_factory.mktemp("kv") / "m", layers=8, hidden=256, heads=8, kv_heads=8
    )
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    return path


def _needed_bytes(model: Path) -> int:
    done = subprocess.run(
        [MLX_CLUSTER, "plan", "--local", "2", "--model", str(model), "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=True,
    )  # fmt: skip
    return max(r["memory_needed_bytes"] for r in json.loads(done.stdout)["ranks"])


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[Server]:
    wired_mb = math.ceil(2 * (_needed_bytes(model) + EXTRA_MB * 2**20) / 2**20)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TEST_WIRED_LIMIT_ENV, str(wired_mb))
        with serving("--local", "2", "--model", str(model)) as s:
            s.wait_ready()
            yield s


def _metrics(s: Server) -> dict[tuple[str, str], float]:
    """(name, rank label or "") -> value."""
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {
        (sample.name, sample.labels.get("rank", "")): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _memory(s: Server) -> dict[str, Any]:
    status, body = s.health()
    assert status == 200, body
    memory: dict[str, Any] = body["memory"]
    return memory


def test_the_budget_is_said_at_start_in_health_and_in_metrics(server: Server) -> None:
    memory = _memory(server)
    assert len(memory["ranks"]) == 2
    for r in memory["ranks"]:  # usable − weights − margin − the prefix cache's share
        left = r["usable_bytes"] - r["weight_bytes"] - r["margin_bytes"] - r["prefix_cache_bytes"]
        assert r["kv_budget_bytes"] == left > 0
        assert r["kv_budget_tokens"] == left // r["kv_bytes_per_token"]
        # The plan reserved the model's whole context; the budget is that and half the extra.
        assert CONTEXT <= r["kv_budget_tokens"] < CONTEXT + EXTRA_MB * 2**20 // 8192
    tokens = memory["kv_budget_tokens"]
    assert tokens == min(r["kv_budget_tokens"] for r in memory["ranks"])
    assert memory["limit_tokens"] == tokens + memory["prefix_cache_tokens"]
    assert f"KV memory budget: {tokens:,} tokens (rank " in server.stderr
    metrics = _metrics(server)
    assert metrics[("mlx_cluster_kv_budget_tokens", "")] == tokens
    assert metrics[("mlx_cluster_kv_limit_tokens", "")] == memory["limit_tokens"]
    for r in memory["ranks"]:
        assert metrics[("mlx_cluster_rank_kv_budget_bytes", str(r["rank"]))] == r["kv_budget_bytes"]


def test_a_request_that_could_never_fit_is_a_400_naming_the_limit(server: Server) -> None:
    limit = _memory(server)["limit_tokens"]
    alone, each_of_two = limit // 2 // 256 * 256, limit // 4 // 256 * 256  # kv_budget.py
    assert each_of_two < alone < CONTEXT  # refused for memory, not for the context
    client = server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", prompt="hello", max_tokens=alone, temperature=0)
    assert caught.value.code == "kv_budget_exceeded"
    assert f"memory budget of {alone} tokens of KV cache" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:  # n counts each choice
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=each_of_two, n=2
        )
    assert f"{each_of_two} tokens of KV cache for each of its n=2 choices" in caught.value.message
    messages = anthropic.Anthropic(
        base_url=server.url.removesuffix("/v1"), api_key="none", max_retries=0, timeout=60
    ).messages
    with pytest.raises(anthropic.BadRequestError) as refused:
        messages.create(model="m", max_tokens=alone, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert f"memory budget of {alone} tokens" in refused.value.message
    assert _metrics(server)[("mlx_cluster_kv_reserved_tokens", "")] == 0  # none was queued


def test_many_long_requests_stay_within_every_ranks_budget_and_all_finish(server: Server) -> None:
    client = server.client().with_options(timeout=600)
    client.completions.create(model="m", prompt="warm", max_tokens=8, temperature=0)
    time.sleep(2.5)  # a heartbeat or two: each rank's peak memory before the burst
    before = _metrics(server)
    memory = _memory(server)
    answers: list[tuple[str, int]] = []

    def chat(i: int) -> None:
        r = client.completions.create(
            model="m", prompt=f"request {i} " * 5, max_tokens=LONG, temperature=0,
            logit_bias={EOS: -100},
        )  # fmt: skip
        answers.append((r.choices[0].finish_reason, r.usage.completion_tokens if r.usage else 0))

    def message(i: int) -> None:
        r = anthropic.Anthropic(
            base_url=server.url.removesuffix("/v1"), api_key="none", max_retries=0, timeout=600
        ).messages.create(
            model="m", max_tokens=LONG, messages=[{"role": "user", "content": f"hello {i}"}]
        )
        answers.append((str(r.stop_reason), r.usage.output_tokens))

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(5)]
    threads += [threading.Thread(target=message, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    queued = running = reserved = 0.0
    while any(t.is_alive() for t in threads):
        now = _metrics(server)
        queued = max(queued, now[("mlx_cluster_queued_sequences", "")])
        running = max(running, now[("mlx_cluster_running_sequences", "")])
        reserved = max(reserved, now[("mlx_cluster_kv_reserved_tokens", "")])
        time.sleep(0.2)
    for t in threads:
        t.join()
    assert len(answers) == 7, server.stderr
    assert answers.count(("length", LONG)) == 5, answers
    assert all(a[0] in ("max_tokens", "end_turn") for a in answers if a[0] != "length"), answers
    # They waited for memory, not for --max-concurrency (8): a few ran at once, the rest queued.
    assert 1 <= running < 7 and queued >= 1, (running, queued)
    assert 0 < reserved <= memory["limit_tokens"]
    time.sleep(2.5)  # the heartbeats after the burst
    after = _metrics(server)
    for r in memory["ranks"]:
        key = ("mlx_cluster_rank_peak_memory_bytes", str(r["rank"]))
        grew = after[key] - before[key]
        for_kv = r["kv_budget_bytes"] + r["prefix_cache_bytes"]  # the cache lends its share
        assert 0 < grew <= for_kv, f"rank {r['rank']} grew {grew} bytes, budget {for_kv}"
        assert after[key] <= r["usable_bytes"]
