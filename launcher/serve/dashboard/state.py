"""GET /v1/cluster/state: one JSON object built from what serve already keeps — the facts and
plan the ranks run on (the LaunchTarget), the ranks' status (RankState), /metrics' own objects
(ServeMetrics: its counters, gauges and last-minute windows) and the event log. Nothing is
counted twice; the dashboard only reads.

Keys: `hosts`, `links`, `problems` (the wiring, as `topology check` found it for this plan),
`plan`, `serving` and `events`. Secrets never enter: no API key, no file-server token, no ssh
destination or option (wiring.py, _plan).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from launcher.ranks.target import LaunchTarget
from launcher.serve.cluster import ServeCluster
from launcher.serve.dashboard.series import Series
from launcher.serve.dashboard.wiring import wiring_json
from launcher.serve.metrics import PREFIX, ServeMetrics

REUSE_S = 0.5  # a state this fresh is handed to the next asker as is (many open pages)
GENERATE = ("/v1/chat/completions", "/v1/completions", "/v1/messages")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _read(metrics: ServeMetrics) -> Samples:
    """Every sample of the /metrics registry, in one pass (what a scrape reads)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in metrics.registry.collect()
        for s in family.samples
    }


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((PREFIX + name, tuple(sorted(labels.items()))), 0.0)


def _width(samples: Samples) -> int | None:
    """The draft width in use (None: not measured yet, the fixed bound applies)."""
    width = samples.get((PREFIX + "draft_width", ()), -1.0)
    return int(width) if width >= 0 else None


def _plan(target: LaunchTarget) -> dict[str, Any]:
    """Which rank holds what where, and each host's memory; never ssh details."""
    plan, n = target.plan, len(target.plan.ranks)
    tensor = plan.strategy == "tensor"
    ranks: list[dict[str, Any]] = []
    hosts: defaultdict[str, dict[str, int]] = defaultdict(
        lambda: {"weights": 0, "kv_cache": 0, "usable": 0}
    )
    for r in plan.ranks:
        start, end = r.layers
        ranks.append({
            "rank": r.rank, "host": r.host, "ip": r.ip, "layers": [start, end],
            "heads_share": 1 / n if tensor else 1.0,
            "heads": f"1/{n} of every layer's heads" if tensor and n > 1 else "all heads",
            "weight_bytes": r.weight_bytes, "kv_cache_bytes": r.kv_cache_bytes,
            "memory_needed_bytes": r.memory_needed_bytes,
            "memory_usable_bytes": r.memory_usable_bytes,
        })  # fmt: skip
        host = hosts[r.host]
        host["weights"] += r.weight_bytes
        host["kv_cache"] += r.kv_cache_bytes
        host["usable"] += r.memory_usable_bytes or 0
    memory = [
        {"host": name, "weight_bytes": m["weights"], "kv_cache_bytes": m["kv_cache"],
         "usable_bytes": m["usable"] or None,
         "free_bytes": max(0, m["usable"] - m["weights"] - m["kv_cache"]) if m["usable"] else None}
        for name, m in hosts.items()
    ]  # fmt: skip
    check = target.check
    if plan.local:
        why = "--local: every rank on this machine, over the TCP ring on 127.0.0.1"
    elif check is not None:
        why = f"the wiring supports {check.backend or 'no backend'} (topology check); "
        why += f"the plan runs {target.backend}"
    else:
        why = f"the plan runs {target.backend}"
    return {
        "model": plan.model, "strategy": plan.strategy, "backend": target.backend,
        "reason": plan.reason, "backend_why": why, "context": plan.context,
        "local": plan.local, "predicted_tok_s": plan.predicted_decode_tok_s,
        "roofline_tok_s": plan.roofline_decode_tok_s, "assumptions": list(plan.assumptions),
        "model_info": dict(plan.model_info), "ranks": ranks, "memory": memory,
    }  # fmt: skip


class DashboardState:
    """Builds the state object; one build serves every asker for REUSE_S."""

    def __init__(self, cluster: ServeCluster, metrics: ServeMetrics, model_id: str) -> None:
        self.cluster, self.metrics, self.model_id = cluster, metrics, model_id
        self.series = Series()
        self._lock = threading.Lock()
        self._last: tuple[float, dict[str, Any]] | None = None

    def current(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last[0] < REUSE_S:
                return self._last[1]
            built = self._build(now)
            self._last = (now, built)
            return built

    def _build(self, now: float) -> dict[str, Any]:
        state = self.cluster.state
        with state.changed:
            status, reason, target = state.status, state.reason, state.target
            heard = [round(now - t, 2) for t in state.heard]
        wiring: dict[str, Any] = {"hosts": [], "links": [], "problems": [], "check": None}
        if target is not None and target.check is not None:
            wiring = wiring_json(target.check)
        serving = self._serving(now, status, reason, target, heard)
        return {
            "model": self.model_id,
            "time": time.time(),
            **wiring,
            "plan": _plan(target) if target is not None else None,
            "serving": serving,
            "events": state.events.to_json(),
        }

    def _serving(
        self, now: float, status: str, reason: str, target: LaunchTarget | None, heard: list[float]
    ) -> dict[str, Any]:
        m, s = self.metrics, _read(self.metrics)
        ttft, itl, step = (w.percentiles(now) for w in (m.ttft_window, m.itl_window, m.step_window))
        drafted, accepted = _get(s, "drafted_tokens_total"), _get(s, "accepted_draft_tokens_total")
        checks = _get(s, "draft_checks_total")
        peaks, steps = (
            {int(labels[0][1]): value for (name, labels), value in s.items()
             if name == PREFIX + metric and labels}
            for metric in ("rank_peak_memory_bytes", "rank_step_seconds")
        )  # fmt: skip
        hosts = [r.host for r in target.plan.ranks] if target is not None else []
        totals = {
            "prompt_tokens": _get(s, "prompt_tokens_total"),
            "generated_tokens": _get(s, "generated_tokens_total"),
            "cached_tokens": _get(s, "cached_tokens_total"),
            "requests": sum(_get(s, "requests_total", endpoint=e, status="200") for e in GENERATE),
            "failovers": _get(s, "failovers_total"),
            "drafted_tokens": drafted, "accepted_draft_tokens": accepted, "draft_checks": checks,
            "prefix_cache_hits": _get(s, "prefix_cache_hits_total"),
            "prefix_cache_lookups": _get(s, "prefix_cache_lookups_total"),
        }  # fmt: skip
        acceptance = accepted / drafted if drafted else None
        figures: dict[str, float | None] = {
            "running": _get(s, "running_sequences"), "queued": _get(s, "queued_sequences"),
            "ttft_p50": ttft["p50"], "ttft_p99": ttft["p99"],
            "itl_p50": itl["p50"], "itl_p99": itl["p99"], "step_p50": step["p50"],
            "prefix_cache_hit_ratio": _get(s, "prefix_cache_hit_ratio"),
            "acceptance": acceptance,
            **{f"peak_memory_rank{r}": v for r, v in peaks.items()},
            **{f"step_rank{r}": v for r, v in steps.items()},
        }  # fmt: skip
        self.series.sample(now, totals, figures)
        rates = self.series.rates()
        per_sequence = 1 / itl["p50"] if itl["p50"] else None
        return {
            "status": status, "reason": reason,
            "running": figures["running"], "queued": figures["queued"],
            "open_requests": _get(s, "open_requests"), "batch": _get(s, "batch_size"),
            "ranks_up": _get(s, "ranks_up"), **rates, "totals": totals,
            "ttft_s": ttft, "itl_s": itl, "step_s": step,
            "prefix_cache": {
                "hit_ratio": figures["prefix_cache_hit_ratio"],
                "bytes": _get(s, "prefix_cache_bytes"), "tokens": _get(s, "prefix_cache_tokens"),
                "budget_tokens": _get(s, "prefix_cache_budget_tokens"),
            },
            "speculative": {
                "acceptance": acceptance,
                "tokens_per_check": (accepted + checks) / checks if checks else None,
                "width": _width(s),
                "step_cost_fixed_s": _get(s, "step_cost_fixed_seconds"),
                "step_cost_per_position_s": _get(s, "step_cost_per_position_seconds"),
                "step_cost_check_s": _get(s, "step_cost_check_seconds"),
                "step_cost_check_per_position_s": _get(
                    s, "step_cost_check_per_position_seconds"
                ),
            },
            "tok_s": {
                "measured": rates["generation_tps"], "per_sequence": per_sequence,
                "predicted": target.plan.predicted_decode_tok_s if target else None,
            },
            "ranks": [
                {"rank": r, "host": hosts[r] if r < len(hosts) else "?",
                 "heard_s_ago": ago, "peak_memory_bytes": peaks.get(r),
                 "step_s": steps.get(r)}
                for r, ago in enumerate(heard)
            ],
            "series": self.series.to_json(now),
        }  # fmt: skip
