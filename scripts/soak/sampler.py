"""Every few seconds: each rank's pid and RSS (/proc), its MLX active and cache memory and the
prefix cache's size and bound (/metrics), /health, and the serve process's own RSS. A daemon
thread with bounded HTTP timeouts, so a stuck server delays a sample, never the run."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .serve import Served, get, health, rss_bytes

PREFIX = "mlx_cluster_"


@dataclass
class RankSample:
    pid: int
    rss: int | None
    mlx_active: float | None
    mlx_cache: float | None

    @property
    def mlx(self) -> float | None:
        if self.mlx_active is None or self.mlx_cache is None:
            return None
        return self.mlx_active + self.mlx_cache


@dataclass
class Sample:
    t: float  # seconds since the soak's clock started
    health: int  # HTTP status, 0: no answer
    plan: str  # "tensor x3" from /health, "" when down
    launcher_rss: int | None
    ranks: dict[int, RankSample] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # unlabelled gauges and counters

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_metrics(text: str) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    """Unlabelled samples by name, and the per-rank ones ({name: {rank: value}})."""
    flat: dict[str, float] = {}
    per_rank: dict[str, dict[int, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name.removeprefix(PREFIX)
            if "rank" in s.labels:
                per_rank.setdefault(name, {})[int(s.labels["rank"])] = s.value
            elif not s.labels:
                flat[name] = s.value
    return flat, per_rank


class Sampler:
    def __init__(self, served: Served, t0: float, every_s: float) -> None:
        self.served, self.t0, self.every_s = served, t0, every_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.samples.append(self.take())
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - began)))

    def take(self) -> Sample:
        served = self.served
        status, body = health(served.root)
        plan = f"{body.get('strategy', '?')} x{body.get('ranks', '?')}" if status == 200 else ""
        code, text = get(served.root + "/metrics")
        flat: dict[str, float] = {}
        per_rank: dict[str, dict[int, float]] = {}
        if code == 200:
            flat, per_rank = read_metrics(text.decode(errors="replace"))
        active = per_rank.get("rank_active_memory_bytes", {})
        cache = per_rank.get("rank_cache_memory_bytes", {})
        ranks = {
            rank: RankSample(pid, rss_bytes(pid), active.get(rank), cache.get(rank))
            for rank, pid in sorted(served.rank_pids().items())
        }
        launcher = rss_bytes(served.proc.popen.pid)
        return Sample(time.monotonic() - self.t0, status, plan, launcher, ranks, flat)
