"""The ranks behind `mlx-cluster serve`: start them, and fail over when they go.

A runner thread supervises one rank job at a time (launcher/ranks/supervisor.py, job mode
"serve"). When the job ends (a rank died, hung or made no progress) every open request ends with
an error at once (on_down), /health turns 503, and the runner re-plans on the hosts that remain
(launcher/serve/failover.py) and starts again. Rank 0's request events go to on_event, its
`stats` and token counts to the metrics. Every job gets the serving limits for its own plan: the
prefix cache's token bound changes with the placement (topology/planning/serving.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from launcher.ranks.jobs import Generation, build_rank_jobs
from launcher.ranks.process import RankProcess
from launcher.ranks.supervisor import (
    EXIT_BAD_INPUT,
    EXIT_RANK_FAILED,
    Deadlines,
    Outcome,
    supervise,
)
from launcher.ranks.target import LaunchTarget, PlanRefused, rank_launches
from launcher.serve.failover import ServeSource, describe
from launcher.serve.metrics import ServeMetrics
from launcher.serve.rejoin import DRAIN_S, Rejoin, check_intervals, lost_hosts, returned
from launcher.serve.tickets import Event
from launcher.share.offer import ModelShare
from topology.errors import InputError
from topology.model.spec import ModelSpec
from topology.planning.serving import prefix_cache_budget

Log = Callable[[str], None]
# From a rank's guard process: not the rank itself answering.
GUARD_EVENTS = ("guard", "link_down", "link_unwatched")
MAX_BACKOFF_S = 30.0  # restarts on the same hosts wait 1, 2, 4 … s, then this long each time


@dataclass(frozen=True)
class ServeLimits:
    """What every serve job is told besides the model: how many sequences decode at once and
    how much memory the prefix cache may take (None: the plan's default)."""

    spec: ModelSpec
    max_running: int
    prefix_cache_bytes: int | None

    def job_options(self, target: LaunchTarget) -> dict[str, Any]:
        budget = prefix_cache_budget(target.plan, self.spec, self.prefix_cache_bytes)
        return {"max_running": self.max_running, "prefix_cache_tokens": budget.tokens}


@dataclass
class _Change:
    """A failure being recovered from, for the "serving again" log line."""

    what: str  # "rank 1 (local1) died", "h2 is back"
    before: str  # "tensor ×2"
    since: float
    back: bool = False  # a host came back: the plan grows


class RankRunner:
    """Runs the serve-mode rank job, and after a failure re-plans and runs the next one."""

    def __init__(
        self,
        source: ServeSource,
        model: str,
        deadlines: Deadlines,
        limits: ServeLimits,
        options: dict[str, Any],
        log: Log,
        on_event: Callable[[Event], None],
        on_down: Callable[[str], None],
        metrics: ServeMetrics,
        open_requests: Callable[[], int] = lambda: 0,
        rejoin: bool = True,
        hub: bool = True,
    ) -> None:
        self.source, self.model, self.deadlines = source, model, deadlines
        self.share = ModelShare(model, hub)  # the model's files, for ranks on other hosts
        self.limits, self.options, self.log = limits, options, log  # options: --job-option
        self._route, self._fail_open = on_event, on_down
        self.metrics = metrics
        self.full_source = source  # every host serve was given: lost ones may come back
        self._open_requests, self._rejoin_enabled = open_requests, rejoin
        self.stop_flag = threading.Event()
        self._job_stop = threading.Event()  # ends the current job only (a switch to more hosts)
        self.rejoining = False  # a larger plan waits for the running requests: new ones wait
        self._rejoin: Rejoin | None = None
        self._watching = False
        self.changed = threading.Condition()  # status changes: launcher/cli/serve.py waits on these
        self.status = "starting"  # starting | ready | restarting | failed | down | stopped
        self.reason = "the ranks are loading the model"
        self.target: LaunchTarget | None = None
        self.first_outcome: Outcome | None = None  # set when the very first start failed
        self.rank0: RankProcess | None = None  # set while ready: where requests go
        self.heard: list[float] = []  # per rank, when it last said anything
        self._change: _Change | None = None
        self._ready_count = 0  # how many jobs reached "ready"
        self._restarts = 0  # restarts on the same hosts since the last ready (the back-off)
        self._pids: dict[int, int] = {}  # rank -> pid, from the ranks' "started" events
        self._thread: threading.Thread | None = None

    def start(self, target: LaunchTarget) -> None:
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self.stop_flag.set()
        self._job_stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.share.close()

    def _run(self, target: LaunchTarget) -> None:
        try:
            self._loop(target)
        except Exception as e:  # never leave /health saying "restarting" forever
            reason = f"the rank runner failed: {type(e).__name__}: {e}"
            self._set_status("down", reason, fail_open=True)
            self.log(f"{reason}; answering 503")
            if self._ready_count == 0:
                self.first_outcome = Outcome(EXIT_RANK_FAILED)
                self._notify()

    def _loop(self, target: LaunchTarget) -> None:
        while True:
            outcome = self._serve(target)
            rejoin, self._rejoin = self._rejoin, None
            if rejoin is not None and not self.stop_flag.is_set():
                self._change = _Change(
                    f"{', '.join(rejoin.back)} is back", describe(target), time.monotonic(), True
                )
                self.source, target = rejoin.source, rejoin.target
                self.log(f"new plan: {describe(target)} ({target.plan.reason}); starting the ranks")
                self._set_status("restarting", f"growing to {describe(target)}", fail_open=True)
                continue
            reason = outcome.failure.message().splitlines()[0] if outcome.failure else "stopped"
            ever_ready = self._ready_count > 0
            self._set_status("down" if ever_ready else "failed", reason, fail_open=True)
            if self.stop_flag.is_set():
                return self._set_status("stopped", "mlx-cluster serve is stopping")
            if not ever_ready:  # the first start failed: the serve command reports it and exits
                self.first_outcome = outcome
                return self._notify()
            if outcome.exit_code == EXIT_BAD_INPUT or outcome.failure is None:
                return self.log(f"cannot restart the ranks ({reason}); answering 503")
            rank = outcome.failure.rank
            self.metrics.failovers.inc()
            change = self._change or _Change("", describe(target), time.monotonic())
            lost, unreachable = self.source.lost_hosts(target, rank, dict(self._pids))
            if unreachable:
                what = f"{', '.join(lost)} stopped answering"
            else:
                what = f"rank {rank} ({lost[0]}) died"
            self._change = replace(change, what=what)
            next_target = self._next_target(lost, reason)
            if next_target is None:
                return self._set_status("stopped", "mlx-cluster serve is stopping")
            target = next_target
            self.log(f"new plan: {describe(target)} ({target.plan.reason}); starting the ranks")
            self._set_status("restarting", f"restarting as {describe(target)} after: {reason}")
            self._watch_lost_hosts()

    def _watch_lost_hosts(self) -> None:
        """One thread at a time asks the lost hosts, with back-off, until one is back."""
        if not self._rejoin_enabled or self._watching:
            return
        if not lost_hosts(self.full_source, self.source):
            return
        self._watching = True
        threading.Thread(target=self._await_return, daemon=True, name="rejoin").start()

    def _await_return(self) -> None:
        try:
            for wait_s in check_intervals():
                if self.stop_flag.wait(wait_s) or not lost_hosts(self.full_source, self.source):
                    return
                with self.changed:
                    ready, target, source = self.status == "ready", self.target, self.source
                if not ready or target is None:
                    continue
                found = returned(self.full_source, source, len(target.plan.ranks))
                if found is not None and self._switch_when_drained(found):
                    return
        finally:
            self._watching = False

    def _switch_when_drained(self, found: Rejoin) -> bool:
        """Hold new requests, let the running ones finish (bounded), then end the job: the loop
        starts the larger plan. False when the cluster failed meanwhile."""
        self.log(
            f"{', '.join(found.back)} answers again; growing to {describe(found.target)} once "
            "the running requests are done"
        )
        with self.changed:
            self.rejoining = True
        end = time.monotonic() + DRAIN_S
        while self._open_requests() and time.monotonic() < end:
            with self.changed:
                if self.status != "ready" or self.stop_flag.is_set():
                    self.rejoining = False
                    self.changed.notify_all()
                    return False
            time.sleep(0.1)
        with self.changed:
            if self.status != "ready":
                self.rejoining = False
                self.changed.notify_all()
                return False
            self._rejoin = found
        self._job_stop.set()
        return True

    def _next_target(self, lost: list[str], reason: str) -> LaunchTarget | None:
        """The plan to restart on: the hosts that remain, or, when none would (the last host,
        `--local 1`) or no plan fits on them, every host again after a back-off, for as long as
        it takes (a failed job is never the end of serving). None once serve is stopping."""
        fewer = self.source.without(lost)
        if fewer.has_hosts():
            self.log(f"{reason}; re-planning on the hosts that remain")
            try:
                target = fewer.replan()
                self.source = fewer
                return target
            except (PlanRefused, InputError) as e:
                self.log(f"no plan fits on the hosts that remain ({e})")
        while True:
            self._restarts += 1
            wait_s = min(MAX_BACKOFF_S, 2.0 ** (self._restarts - 1))
            self.log(f"{reason}; restarting on the same hosts in {wait_s:.0f} s")
            self._set_status("restarting", f"restarting in {wait_s:.0f} s after: {reason}")
            if self.stop_flag.wait(wait_s):
                return None
            try:
                return self.source.replan()
            except (PlanRefused, InputError) as e:
                reason = f"no plan fits: {e}"

    def _serve(self, target: LaunchTarget) -> Outcome:
        """One supervised job of serve-mode ranks; returns when it ends."""
        jobs = build_rank_jobs(
            target.hostfile,
            strategy=target.plan.strategy,
            model=self.model,
            generation=Generation(prompt=""),
            layer_split=target.plan.layer_split,
            port=target.port,
            deadlines=self.deadlines,
        )
        limits = self.limits.job_options(target)
        self.metrics.cache_budget.set(limits["prefix_cache_tokens"])
        options = {**limits, **self.options}  # --job-option (test hooks) wins
        jobs = [replace(j, mode="serve", options=dict(options)) for j in jobs]
        jobs = self.share.jobs(target, jobs)
        with self.changed:
            self.target = target
            self.heard = [time.monotonic()] * len(jobs)
            self._pids = {}
            if not self.stop_flag.is_set():
                self._job_stop.clear()
        return supervise(
            rank_launches(target, jobs),
            on_text=lambda _text: None,  # serve ranks write nothing on stdout
            on_event=self._on_event,
            deadlines=self.deadlines,
            on_started=self._on_started,
            stop=self._job_stop,
        )

    def _on_started(self, ranks: list[RankProcess]) -> None:
        with self.changed:
            self.rank0 = ranks[0]

    def _on_event(self, rank: int, event: dict[str, Any]) -> None:
        name = event.get("event")
        # Rank 0 sends one step's request events as one `batch` line (one write, one parse).
        events = event.get("events") or [] if name == "batch" else [event]
        with self.changed:
            if rank < len(self.heard) and name not in GUARD_EVENTS:  # the rank's own voice
                self.heard[rank] = time.monotonic()
            if name == "started" and isinstance(event.get("pid"), int):
                self._pids[rank] = event["pid"]
            if rank == 0:
                for e in events:
                    if e.get("event") != "stats":
                        self._route(e)
        if rank == 0:
            for e in events:
                self.metrics.rank_event(e)
        if name == "ready" and rank == 0:
            self._ready()

    def _ready(self) -> None:
        assert self.target is not None
        now = describe(self.target)
        self._ready_count += 1
        self._restarts = 0
        with self.changed:
            self.rejoining = False
        self._set_status("ready", f"serving as {now}")
        change, self._change = self._change, None
        if change is not None:
            took = time.monotonic() - change.since
            if change.back:
                self.log(f"{change.what}: {change.before} → {now} in {took:.1f} s")
            else:
                self.log(
                    f"{change.what}; re-planned {change.before} → {now} in {took:.1f} s; "
                    "serving again"
                )

    def _set_status(self, status: str, reason: str, fail_open: bool = False) -> None:
        with self.changed:
            self.status, self.reason = status, reason
            if status not in ("ready", "restarting"):  # the switch to more hosts failed
                self.rejoining = False
            if status != "ready":
                self.rank0 = None
                self.metrics.ranks_down()
            if fail_open:  # every open request ends now, with the reason
                self._fail_open(reason)
            self.changed.notify_all()

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()
