"""The serve-mode ranks as the rest of `serve` sees them, and their events routed.

RankState is what the runner's threads share with the HTTP side (cluster.py: where a request
goes, /health) and the serve command (the ready line): one Condition, `changed`, guards every
field and wakes whoever waits on a change. RankEvents takes each event line of a rank (on the
supervisor's threads): a rank's own voice counts as heard for /health, rank 0's request events
go to their tickets, all of rank 0's events (its `stats` too) to the metrics, every rank's
heartbeat (its peak memory) to the metrics and its model copy to the event log, and rank 0's
`ready` starts serving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from launcher.ranks.process import RankProcess
from launcher.ranks.supervisor import Outcome
from launcher.ranks.target import LaunchTarget
from launcher.serve.dashboard.events import EventLog
from launcher.serve.metrics import ServeMetrics
from launcher.serve.tickets import Event

# From a rank's guard process: not the rank itself answering.
GUARD_EVENTS = ("guard", "link_down", "link_unwatched")


class RankState:
    """The current job's ranks: status, plan, rank 0's process, when each rank last spoke."""

    def __init__(self, metrics: ServeMetrics, fail_open: Callable[[str], None]) -> None:
        self._metrics, self._fail_open = metrics, fail_open  # fail_open ends every open request
        self.changed = threading.Condition()  # status changes: launcher/cli/serve.py waits on these
        self.status = "starting"  # starting | ready | restarting | failed | down | stopped
        self.reason = "the ranks are loading the model"
        self.target: LaunchTarget | None = None
        self.first_outcome: Outcome | None = None  # set when the very first start failed
        self.rank0: RankProcess | None = None  # set while ready: where requests go
        self.heard: list[float] = []  # per rank, when it last said anything
        self.pids: dict[int, int] = {}  # rank -> pid, from the ranks' "started" events
        self.rejoining = False  # a larger plan waits for the running requests: new ones wait
        self.events = EventLog()  # what happened, for the dashboard (its own lock)

    def host_of(self, rank: int) -> str:
        target = self.target
        ranks = target.plan.ranks if target is not None else ()
        return ranks[rank].host if 0 <= rank < len(ranks) else "?"

    def new_job(self, target: LaunchTarget, ranks: int) -> None:
        with self.changed:
            self.target = target
            self.heard = [time.monotonic()] * ranks
            self.pids = {}

    def set_status(self, status: str, reason: str, fail_open: bool = False) -> None:
        with self.changed:
            self.status, self.reason = status, reason
            if status not in ("ready", "restarting"):  # the switch to more hosts failed
                self.rejoining = False
            if status != "ready":
                self.rank0 = None
                self._metrics.ranks_down()
            if fail_open:  # every open request ends now, with the reason
                self._fail_open(reason)
            self.changed.notify_all()

    def first_start_failed(self, outcome: Outcome) -> None:
        """The serve command reports this outcome and exits."""
        with self.changed:
            self.first_outcome = outcome
            self.changed.notify_all()


class RankEvents:
    """The supervisor's on_started / on_event for serve-mode ranks."""

    def __init__(
        self,
        state: RankState,
        on_request_event: Callable[[Event], None],
        metrics: ServeMetrics,
        on_ready: Callable[[], None],
    ) -> None:
        self._state, self._route, self._metrics = state, on_request_event, metrics
        self._on_ready = on_ready

    def on_started(self, ranks: list[RankProcess]) -> None:
        with self._state.changed:
            self._state.rank0 = ranks[0]

    def on_event(self, rank: int, event: dict[str, Any]) -> None:
        name = event.get("event")
        # Rank 0 sends one step's request events as one `batch` line (one write, one parse).
        events = event.get("events") or [] if name == "batch" else [event]
        state = self._state
        if rank == 0:  # counted before routed: a client that has its answer sees it in /metrics
            if any(e.get("event") == "delta" for e in events):
                self._metrics.step_line(time.monotonic())
            for e in events:
                self._metrics.rank_event(e)
        with state.changed:
            if rank < len(state.heard) and name not in GUARD_EVENTS:  # the rank's own voice
                state.heard[rank] = time.monotonic()
            if name == "started" and isinstance(event.get("pid"), int):
                state.pids[rank] = event["pid"]
            if rank == 0:
                for e in events:
                    if e.get("event") != "stats":
                        self._route(e)
            host = state.host_of(rank)
        self._rank_figures(rank, host, name, event)
        if name == "ready" and rank == 0:
            self._on_ready()

    def _rank_figures(self, rank: int, host: str, name: object, event: dict[str, Any]) -> None:
        """Any rank: its peak memory (heartbeat) and its model copy (download progress, then
        what it copied in all, on `decode`)."""
        if name == "heartbeat":
            self._metrics.heartbeat(rank, event)
        elif name == "progress" and event.get("stage") == "download":
            self._state.events.copy_step(rank, host, event)
        elif name == "decode" and isinstance(event.get("copied"), dict):
            self._state.events.copied(rank, host, event["copied"])
