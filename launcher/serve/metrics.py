"""`GET /metrics` of `mlx-cluster serve`: Prometheus text from its own registry.

Measured in the launcher: requests by endpoint and status, time to first token (submit → first
delta), inter-token latency (between one request's deltas) and the batch's step time (between
rank 0's step lines while it decodes). From rank 0's events: token counts (`done`) and the batch
and prefix-cache figures (`stats`, at most once a second); from every rank's heartbeat, its peak,
active and cache memory. The rank's prefix-cache hits and lookups restart from 0 with every new
job, so the counters here add up their increases. The dashboard (launcher/serve/dashboard/)
reads these same objects; the last minute's percentiles come from windows fed beside the
histograms.
Thread-safe: supervisor threads write, the HTTP loop reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from launcher.serve.dashboard.window import Window

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "mlx_cluster_"
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
STEP_GAP_S = 2.0  # a longer gap between rank 0's step lines is idle time, not a step
# The routes /metrics names; anything else is "other" (a label per unknown path would let any
# client grow the registry without bound).
ENDPOINTS = (
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/",
    "/v1/cluster/state",
    "/v1/cluster/stream",
)
MODEL_ENDPOINT = "/v1/models/{id}"


def endpoint_label(path: str) -> str:
    path = path.rstrip("/") or "/"
    if path in ENDPOINTS:
        return path
    if path.startswith("/dashboard/"):
        return "/dashboard/{file}"
    return MODEL_ENDPOINT if path.startswith("/v1/models/") else "other"


def _int(event: dict[str, Any], key: str) -> int:
    value = event.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            PREFIX + "requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
            registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens", registry=r)
        self.generated_tokens = Counter(
            PREFIX + "generated_tokens", "Generated (completion) tokens", registry=r
        )
        self.cached_tokens = Counter(
            PREFIX + "cached_tokens", "Prompt tokens taken from the prefix cache", registry=r
        )
        # Speculation, from each finished request: tokens drafted, drafted tokens kept, and
        # forwards that checked drafts (accepted / checks: tokens gained per such forward).
        self.drafted_tokens = Counter(
            PREFIX + "drafted_tokens", "Draft tokens checked by the model", registry=r
        )
        self.accepted_tokens = Counter(
            PREFIX + "accepted_draft_tokens", "Draft tokens the model kept", registry=r
        )
        self.draft_checks = Counter(
            PREFIX + "draft_checks", "Forwards that checked a sequence's draft", registry=r
        )
        # The draft width rank 0 chose from its measured step costs (-1: not measured yet, the
        # fixed bound applies) and that cost model: fixed + per position x positions (+ check).
        self.draft_width = Gauge(
            PREFIX + "draft_width", "Drafted tokens a checking forward reads per sequence",
            registry=r,
        )  # fmt: skip
        self.draft_width.set(-1)
        self.step_cost_fixed = Gauge(
            PREFIX + "step_cost_fixed_seconds", "Measured step cost: its fixed part", registry=r
        )
        self.step_cost_per_position = Gauge(
            PREFIX + "step_cost_per_position_seconds",
            "Measured step cost: seconds per position a forward reads (rows x (width + 1))",
            registry=r,
        )  # fmt: skip
        self.step_cost_check = Gauge(
            PREFIX + "step_cost_check_seconds",
            "Measured step cost: what checking drafts adds to a step", registry=r,
        )  # fmt: skip
        self.step_cost_check_per_position = Gauge(
            PREFIX + "step_cost_check_per_position_seconds",
            "Measured step cost: seconds per position a checking forward computes",
            registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "Submit to first generated text",
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds", "Between one request's text deltas",
            buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.running = Gauge(PREFIX + "running_sequences", "Sequences decoding", registry=r)
        self.queued = Gauge(PREFIX + "queued_sequences", "Requests waiting on rank 0", registry=r)
        self.batch = Gauge(PREFIX + "batch_size", "Sequences in the last batch step", registry=r)
        self.cache_bytes = Gauge(PREFIX + "prefix_cache_bytes", "Prefix cache size", registry=r)
        self.cache_tokens = Gauge(
            PREFIX + "prefix_cache_tokens", "Tokens held by the prefix cache", registry=r
        )
        self.cache_budget = Gauge(
            PREFIX + "prefix_cache_budget_tokens", "The prefix cache's bound", registry=r
        )
        self.cache_ratio = Gauge(
            PREFIX + "prefix_cache_hit_ratio", "Hits / lookups of the current ranks", registry=r
        )
        self.cache_hits = Counter(PREFIX + "prefix_cache_hits", "Prefix cache hits", registry=r)
        self.cache_lookups = Counter(
            PREFIX + "prefix_cache_lookups", "Prefix cache lookups", registry=r
        )
        self.ranks_up = Gauge(PREFIX + "ranks_up", "Ranks of the plan while serving", registry=r)
        self.open_requests = Gauge(
            PREFIX + "open_requests", "Requests accepted and not yet ended", registry=r
        )
        self.failovers = Counter(PREFIX + "failovers", "Re-plans after a lost rank", registry=r)
        self.step = Gauge(
            PREFIX + "step_seconds", "Rank 0's last batch step (ranks step in lockstep)", registry=r
        )
        self.peak_memory = Gauge(
            PREFIX + "rank_peak_memory_bytes", "Each rank's peak MLX memory", ["rank"], registry=r
        )
        # What MLX holds now (active arrays, and freed buffers kept for reuse): a soak run
        # watches these for growth, which the peak alone would not show until it beat the peak.
        self.active_memory = Gauge(
            PREFIX + "rank_active_memory_bytes", "Each rank's active MLX memory", ["rank"],
            registry=r,
        )  # fmt: skip
        self.cache_memory = Gauge(
            PREFIX + "rank_cache_memory_bytes", "Each rank's MLX buffer cache", ["rank"],
            registry=r,
        )  # fmt: skip
        # Each rank's own median decoding step over its last heartbeat; it includes the rank's
        # waits on the others, so tensor ranks in lockstep are close and pipeline stages differ.
        self.rank_step = Gauge(
            PREFIX + "rank_step_seconds", "Each rank's median decoding step, as it measured it",
            ["rank"], registry=r,
        )  # fmt: skip
        # The KV memory budget (topology/planning/serving.py), set with each plan; what it holds
        # for the running sequences comes with `stats`.
        self.kv_budget = Gauge(
            PREFIX + "kv_budget_tokens", "KV budget of the tightest rank, in tokens", registry=r
        )
        self.kv_limit = Gauge(
            PREFIX + "kv_limit_tokens", "KV budget plus the prefix cache's lent share", registry=r
        )
        self.kv_reserved = Gauge(
            PREFIX + "kv_reserved_tokens", "KV positions held for running sequences", registry=r
        )
        self.rank_kv_budget = Gauge(
            PREFIX + "rank_kv_budget_bytes", "Each rank's KV budget", ["rank"], registry=r
        )
        self.ttft_window, self.itl_window, self.step_window = Window(), Window(), Window()
        self._lock = threading.Lock()
        self._seen_hits = self._seen_lookups = 0  # the rank's own running totals
        self._last_step_line: float | None = None

    def watch(self, ranks_up: Callable[[], int], open_requests: Callable[[], int]) -> None:
        """Gauges read at scrape time from the cluster's state."""
        self.ranks_up.set_function(lambda: float(ranks_up()))
        self.open_requests.set_function(lambda: float(open_requests()))

    def request(self, path: str, status: int) -> None:
        self.requests.labels(endpoint_label(path), str(status)).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.ttft_window.add(seconds)

    def inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)
        self.itl_window.add(seconds)

    def step_line(self, now: float) -> None:
        """Rank 0 sent one decoding step's token events: the gap since the previous one is a
        step (rank 0 writes one line per step; a long gap means the batch was idle)."""
        with self._lock:
            last, self._last_step_line = self._last_step_line, now
        if last is not None and 0 < now - last <= STEP_GAP_S:
            self.step.set(now - last)
            self.step_window.add(now - last)

    def heartbeat(self, rank: int, event: dict[str, Any]) -> None:
        """A rank's heartbeat: its peak, active and cache memory once MLX has loaded there, and
        its median step since the last heartbeat while it decodes."""
        peak = _int(event, "peak_memory_bytes")
        if peak:
            self.peak_memory.labels(str(rank)).set(peak)
        for key, gauge in (
            ("active_memory_bytes", self.active_memory),
            ("cache_memory_bytes", self.cache_memory),
        ):
            if isinstance(event.get(key), int):  # 0 is a real value here (an emptied cache)
                gauge.labels(str(rank)).set(_int(event, key))
        step_s = event.get("step_s")
        if isinstance(step_s, int | float) and not isinstance(step_s, bool) and step_s >= 0:
            self.rank_step.labels(str(rank)).set(step_s)

    def memory_budget(self, budget: dict[str, Any]) -> None:
        """The plan's KV memory budget (MemoryBudget.to_json()), set for every new plan."""
        self.kv_budget.set(budget.get("kv_budget_tokens") or 0)
        self.kv_limit.set(budget.get("limit_tokens") or 0)
        self.rank_kv_budget.clear()
        for r in budget.get("ranks", []):
            if r.get("kv_budget_bytes") is not None:
                self.rank_kv_budget.labels(str(r["rank"])).set(r["kv_budget_bytes"])

    def rank_event(self, event: dict[str, Any]) -> None:
        """One of rank 0's events: token counts from `done`, figures from `stats`."""
        name = event.get("event")
        if name == "done" and event.get("finish_reason") != "count":  # count_tokens runs nothing
            self.prompt_tokens.inc(_int(event, "prompt_tokens"))
            self.generated_tokens.inc(_int(event, "completion_tokens"))
            self.cached_tokens.inc(_int(event, "cached_tokens"))
            self.drafted_tokens.inc(_int(event, "drafted_tokens"))
            self.accepted_tokens.inc(_int(event, "accepted_tokens"))
            self.draft_checks.inc(_int(event, "draft_checks"))
        elif name == "stats":
            self._stats(event)

    def _stats(self, event: dict[str, Any]) -> None:
        self.running.set(_int(event, "running"))
        self.queued.set(_int(event, "queued"))
        self.batch.set(_int(event, "batch"))
        self.cache_bytes.set(_int(event, "prefix_cache_bytes"))
        self.cache_tokens.set(_int(event, "prefix_cache_tokens"))
        self.kv_reserved.set(_int(event, "kv_reserved_tokens"))
        if "draft_width" in event:
            width = event["draft_width"]
            self.draft_width.set(width if isinstance(width, int) else -1)
        for gauge, key in (
            (self.step_cost_fixed, "step_cost_fixed_s"),
            (self.step_cost_per_position, "step_cost_per_position_s"),
            (self.step_cost_check, "step_cost_check_s"),
            (self.step_cost_check_per_position, "step_cost_check_per_position_s"),
        ):
            value = event.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                gauge.set(value)
        hits, lookups = _int(event, "prefix_cache_hits"), _int(event, "prefix_cache_lookups")
        self.cache_ratio.set(hits / lookups if lookups else 0.0)
        with self._lock:  # a total below the last one: new ranks, counting from 0 again
            self.cache_hits.inc(hits - self._seen_hits if hits >= self._seen_hits else hits)
            self.cache_lookups.inc(
                lookups - self._seen_lookups if lookups >= self._seen_lookups else lookups
            )
            self._seen_hits, self._seen_lookups = hits, lookups

    def ranks_down(self) -> None:
        """The ranks are gone: nothing is decoding or queued on them any more."""
        for gauge in (self.running, self.queued, self.batch, self.cache_bytes, self.cache_tokens):
            gauge.set(0)
        self.cache_ratio.set(0)
        self.kv_reserved.set(0)
        self.step.set(0)
        self.draft_width.set(-1)  # the next ranks measure their own costs
        for per_rank in (self.peak_memory, self.active_memory, self.cache_memory, self.rank_step):
            per_rank.clear()  # the next plan's ranks may be fewer
        with self._lock:
            self._seen_hits = self._seen_lookups = 0
            self._last_step_line = None

    def render(self) -> bytes:
        return generate_latest(self.registry)
