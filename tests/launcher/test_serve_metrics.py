"""`GET /metrics`: Prometheus text parsed by prometheus_client's own parser, counters moving with
real requests to a real server, and the metrics object fed rank 0's events directly."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_helpers import tiny_model
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import Server, serving

from launcher.serve.metrics import ServeMetrics, endpoint_label

__all__ = ["tiny_model"]  # the fixture

KEY = "metrics-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with serving("--local", "1", "--model", str(tiny_model), "--api-key", KEY) as s:
        s.wait_ready()
        yield s


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample (0 when absent, as a counter that never moved)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _scrape(s: Server) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    try:
        conn.request("GET", "/metrics")  # no key: like /health
        response = conn.getresponse()
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()
    finally:
        conn.close()


def test_metrics_parse_and_describe_the_cluster(server: Server) -> None:
    text = _scrape(server)
    names = {f.name for f in text_string_to_metric_families(text)}
    for expected in (
        "mlx_cluster_requests",
        "mlx_cluster_generated_tokens",
        "mlx_cluster_time_to_first_token_seconds",
        "mlx_cluster_inter_token_latency_seconds",
        "mlx_cluster_running_sequences",
        "mlx_cluster_queued_sequences",
        "mlx_cluster_batch_size",
        "mlx_cluster_prefix_cache_bytes",
        "mlx_cluster_prefix_cache_hit_ratio",
        "mlx_cluster_prefix_cache_hits",
        "mlx_cluster_failovers",
    ):
        assert expected in names, names
    assert _sample(text, "mlx_cluster_ranks_up") == 1
    assert _sample(text, "mlx_cluster_failovers_total") == 0
    assert _sample(text, "mlx_cluster_prefix_cache_budget_tokens") > 0


def test_counters_move_with_real_requests(server: Server) -> None:
    before = _scrape(server)
    out = server.client(KEY).completions.create(model="m", prompt="Hello", max_tokens=8)
    assert out.usage is not None
    body = json.dumps({"prompt": "x", "max_tokens": 0}).encode()
    assert server.request("POST", "/v1/completions", body, AUTH)[0] == 400
    assert server.request("POST", "/v1/completions", body)[0] == 401
    after = _scrape(server)

    def moved(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    endpoint = "/v1/completions"
    assert moved("mlx_cluster_requests_total", endpoint=endpoint, status="200") == 1
    assert moved("mlx_cluster_requests_total", endpoint=endpoint, status="400") == 1
    assert moved("mlx_cluster_requests_total", endpoint=endpoint, status="401") == 1
    assert moved("mlx_cluster_generated_tokens_total") == out.usage.completion_tokens
    assert moved("mlx_cluster_prompt_tokens_total") == out.usage.prompt_tokens
    assert moved("mlx_cluster_time_to_first_token_seconds_count") == 1
    assert moved("mlx_cluster_time_to_first_token_seconds_sum") > 0
    assert moved("mlx_cluster_requests_total", endpoint="/metrics", status="200") == 1


def test_rank_events_feed_tokens_gauges_and_cache_counters() -> None:
    m = ServeMetrics()
    done = {"event": "done", "prompt_tokens": 10, "completion_tokens": 4, "cached_tokens": 6}
    m.rank_event(done)
    stats = {
        "event": "stats",
        "running": 3,
        "queued": 2,
        "batch": 3,
        "prefix_cache_bytes": 4096,
        "prefix_cache_tokens": 32,
        "prefix_cache_entries": 2,
        "prefix_cache_hits": 3,
        "prefix_cache_lookups": 4,
    }
    m.rank_event(stats)
    m.rank_event({**stats, "prefix_cache_hits": 5, "prefix_cache_lookups": 8})
    m.ranks_down()  # new ranks count from 0 again: the counters keep adding up
    m.rank_event({**stats, "prefix_cache_hits": 1, "prefix_cache_lookups": 2})
    m.first_token(0.3)
    m.inter_token(0.02)
    m.request("/v1/models/some/model", 200)
    m.request("/what/ever", 404)
    text = m.render().decode()
    assert _sample(text, "mlx_cluster_cached_tokens_total") == 6
    assert _sample(text, "mlx_cluster_generated_tokens_total") == 4
    assert _sample(text, "mlx_cluster_running_sequences") == 3
    assert _sample(text, "mlx_cluster_queued_sequences") == 2
    assert _sample(text, "mlx_cluster_prefix_cache_bytes") == 4096
    assert _sample(text, "mlx_cluster_prefix_cache_hits_total") == 5 + 1
    assert _sample(text, "mlx_cluster_prefix_cache_lookups_total") == 8 + 2
    assert _sample(text, "mlx_cluster_prefix_cache_hit_ratio") == 0.5
    assert _sample(text, "mlx_cluster_inter_token_latency_seconds_count") == 1
    assert _sample(text, "mlx_cluster_requests_total", endpoint="/v1/models/{id}") == 1
    assert _sample(text, "mlx_cluster_requests_total", endpoint="other", status="404") == 1
    m.ranks_down()
    assert _sample(m.render().decode(), "mlx_cluster_running_sequences") == 0


def test_heartbeats_feed_each_ranks_memory_until_the_ranks_go_down() -> None:
    m = ServeMetrics()
    m.heartbeat(0, {"event": "heartbeat", "peak_memory_bytes": 900})  # MLX not loaded on all
    m.heartbeat(
        1,
        {"peak_memory_bytes": 700, "active_memory_bytes": 500, "cache_memory_bytes": 0},
    )
    text = m.render().decode()
    assert _sample(text, "mlx_cluster_rank_peak_memory_bytes", rank="0") == 900
    assert _sample(text, "mlx_cluster_rank_peak_memory_bytes", rank="1") == 700
    assert _sample(text, "mlx_cluster_rank_active_memory_bytes", rank="1") == 500
    assert 'mlx_cluster_rank_cache_memory_bytes{rank="1"} 0.0' in text  # an emptied cache
    assert 'rank_active_memory_bytes{rank="0"}' not in text  # never reported: not a made-up 0
    m.heartbeat(1, {"step_s": 0.012})  # its own median step since its last heartbeat
    m.heartbeat(0, {"step_s": "fast"})  # not a number: ignored
    text = m.render().decode()
    assert _sample(text, "mlx_cluster_rank_step_seconds", rank="1") == pytest.approx(0.012)
    assert 'rank_step_seconds{rank="0"}' not in text
    m.ranks_down()
    assert "rank_active_memory_bytes{" not in m.render().decode()
    assert "rank_step_seconds{" not in m.render().decode()


def test_endpoint_labels_are_bounded() -> None:
    assert endpoint_label("/v1/completions/") == "/v1/completions"
    assert endpoint_label("/v1/models/a/b") == "/v1/models/{id}"
    assert endpoint_label("/" + "x" * 50) == "other"
