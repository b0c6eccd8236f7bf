"""The ranks behind `mlx-cluster serve`: start them, and fail over when they go.

A runner thread supervises one rank job at a time (launcher/ranks/supervisor.py, job mode
"serve"). When the job ends (a rank died, hung or made no progress) every open request ends with
an error at once (on_down), /health turns 503, and the runner re-plans on the hosts that remain
(failover.py) and starts the next job; when lost hosts answer again, rejoin.py ends the job so the
runner starts a larger one. The ranks' events are routed by rank_state.py (requests to on_event,
`stats` and token counts to the metrics). Every job gets the serving limits for its own plan: the
prefix cache's token bound changes with the placement (topology/planning/serving.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cluster.job import RankJob
from launcher.ranks.jobs import Generation, build_rank_jobs
from launcher.ranks.supervisor import (
    EXIT_BAD_INPUT,
    EXIT_RANK_FAILED,
    Deadlines,
    Outcome,
    supervise,
)
from launcher.ranks.target import LaunchTarget, rank_launches
from launcher.serve.failover import Failover, Log, PlanChange, ServeSource, describe
from launcher.serve.metrics import ServeMetrics
from launcher.serve.rank_state import RankEvents, RankState
from launcher.serve.rejoin import Rejoin, RejoinWatcher
from launcher.serve.tickets import Event
from launcher.share.offer import ModelShare
from topology.model.spec import ModelSpec
from topology.planning.serving import MemoryBudget, memory_budget, prefix_cache_budget

STOPPING = "mlx-cluster serve is stopping"


@dataclass(frozen=True)
class ServeLimits:
    """What every serve job is told besides the model: how many sequences decode at once and
    how much memory the prefix cache may take (None: the plan's default)."""

    spec: ModelSpec
    max_running: int
    prefix_cache_bytes: int | None

    def job_options(self, target: LaunchTarget) -> dict[str, Any]:
        budget = prefix_cache_budget(target.plan, self.spec, self.prefix_cache_bytes)
        memory = self.memory(target).job_options()  # the KV budget rank 0 admits by
        return {"max_running": self.max_running, "prefix_cache_tokens": budget.tokens, **memory}

    def memory(self, target: LaunchTarget) -> MemoryBudget:
        """Every rank's KV memory budget on this plan."""
        prefix = prefix_cache_budget(target.plan, self.spec, self.prefix_cache_bytes)
        return memory_budget(target.plan, self.spec, prefix)


class RankRunner:
    """Runs the serve-mode rank job, and after a failure or a return runs the next one."""

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
        self.model, self.deadlines, self.limits = model, deadlines, limits
        self.options, self.log, self.metrics = options, log, metrics  # options: --job-option
        self.share = ModelShare(model, hub)  # the model's files, for ranks on other hosts
        self.stop_flag = threading.Event()
        self._job_stop = threading.Event()  # ends the current job only (a switch to more hosts)
        self.state = RankState(metrics, on_down)
        self.events = RankEvents(self.state, on_event, metrics, on_ready=self._ready)
        self.failover = Failover(
            source, log, self.stop_flag, self.state.set_status, events=self.state.events
        )
        self.rejoin = RejoinWatcher(
            source,
            self.failover,
            self.state,
            open_requests,
            log,
            stop=self.stop_flag,
            end_job=self._job_stop,
            enabled=rejoin,
        )
        self._change: PlanChange | None = None
        self._ever_ready = False
        self._thread: threading.Thread | None = None

    # What the serve command reads (launcher/cli/serve.py), under `changed`.
    @property
    def changed(self) -> threading.Condition:
        return self.state.changed

    @property
    def status(self) -> str:
        return self.state.status

    @property
    def reason(self) -> str:
        return self.state.reason

    @property
    def target(self) -> LaunchTarget | None:
        return self.state.target

    @property
    def first_outcome(self) -> Outcome | None:
        return self.state.first_outcome

    def start(self, target: LaunchTarget) -> None:
        self.state.events.add(
            "started", f"loading the model as {describe(target)} ({target.backend})"
        )
        self._thread = threading.Thread(
            target=self._run, args=(target,), daemon=True, name="rank runner"
        )
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
            self.state.set_status("down", reason, fail_open=True)
            self.log(f"{reason}; answering 503")
            if not self._ever_ready:
                self.state.first_start_failed(Outcome(EXIT_RANK_FAILED))

    def _loop(self, target: LaunchTarget) -> None:
        while True:
            outcome = self._run_job(target)
            grown = self.rejoin.take()
            if grown is not None and not self.stop_flag.is_set():
                target = self._grow(grown, target)
                continue
            reason = outcome.failure.message().splitlines()[0] if outcome.failure else "stopped"
            if outcome.failure is not None and not self.stop_flag.is_set():
                self.state.events.failure(outcome.failure.message())  # the whole message
            down = "down" if self._ever_ready else "failed"
            self.state.set_status(down, reason, fail_open=True)
            if self.stop_flag.is_set():
                return self.state.set_status("stopped", STOPPING)
            if not self._ever_ready:  # the first start failed: the serve command reports it
                return self.state.first_start_failed(outcome)
            if outcome.exit_code == EXIT_BAD_INPUT or outcome.failure is None:
                return self.log(f"cannot restart the ranks ({reason}); answering 503")
            next_target = self._fail_over(target, outcome.failure.rank, reason)
            if next_target is None:
                return self.state.set_status("stopped", STOPPING)
            target = next_target
            self._new_plan(target)
            self.state.set_status("restarting", f"restarting as {describe(target)} after: {reason}")
            self.rejoin.watch()

    def _grow(self, grown: Rejoin, target: LaunchTarget) -> LaunchTarget:
        """Lost hosts are back: the next job runs on the larger plan."""
        what = f"{', '.join(grown.back)} is back"
        self._change = PlanChange(what, describe(target), time.monotonic(), back=True)
        self.failover.source, target = grown.source, grown.target
        self._new_plan(target)
        self.state.set_status("restarting", f"growing to {describe(target)}", fail_open=True)
        return target

    def _new_plan(self, target: LaunchTarget) -> None:
        line = f"new plan: {describe(target)} ({target.plan.reason})"
        self.state.events.add("plan", f"{line} on {', '.join(_hosts(target))}")
        self.log(f"{line}; starting the ranks")

    def _fail_over(self, target: LaunchTarget, rank: int, reason: str) -> LaunchTarget | None:
        """`rank` failed: the plan without its host (or the hosts gone), None once stopping."""
        self.metrics.failovers.inc()
        change = self._change or PlanChange("", describe(target), time.monotonic())
        lost, what = self.failover.lost(target, rank, dict(self.state.pids))
        self._change = replace(change, what=what)  # a failure while restarting keeps `since`
        self.state.events.add("failover", f"{what}; re-planning")
        return self.failover.next_target(lost, reason)

    def _run_job(self, target: LaunchTarget) -> Outcome:
        """One supervised job of serve-mode ranks; returns when it ends."""
        jobs = self._jobs(target)
        # The job's stop is re-armed with its target under one hold (the lock is re-entrant).
        with self.state.changed:
            self.state.new_job(target, len(jobs))
            if not self.stop_flag.is_set():
                self._job_stop.clear()
        return supervise(
            rank_launches(target, jobs),
            on_text=lambda _text: None,  # serve ranks write nothing on stdout
            on_event=self.events.on_event,
            deadlines=self.deadlines,
            on_started=self.events.on_started,
            stop=self._job_stop,
        )

    def _jobs(self, target: LaunchTarget) -> list[RankJob]:
        jobs = build_rank_jobs(
            target.hostfile,
            strategy=target.plan.strategy,
            model=self.model,
            generation=Generation(prompt=""),
            layer_split=target.plan.layer_split,
            tensor_shares=[r.tensor_share for r in target.plan.ranks],
            port=target.port,
            deadlines=self.deadlines,
        )
        limits = self.limits.job_options(target)
        self.metrics.cache_budget.set(limits["prefix_cache_tokens"])
        self.metrics.memory_budget(self.limits.memory(target).to_json())
        options = {**limits, **self.options}  # --job-option (test hooks) wins
        jobs = [replace(j, mode="serve", options=dict(options)) for j in jobs]
        return self.share.jobs(target, jobs)

    def _ready(self) -> None:
        """Rank 0 is ready: serving (again), and the log says what changed and how long it took."""
        assert self.state.target is not None
        now = describe(self.state.target)
        self._ever_ready = True
        self.failover.serving()
        with self.state.changed:
            self.state.rejoining = False
        self.state.set_status("ready", f"serving as {now}")
        change, self._change = self._change, None
        if change is None:
            return self.state.events.add(
                "serving", f"serving as {now} ({self.state.target.backend})"
            )
        self.log(change.done(now))
        self.state.events.add("rejoined" if change.back else "serving", change.done(now))


def _hosts(target: LaunchTarget) -> list[str]:
    """The plan's hosts once each, in rank order."""
    return list(dict.fromkeys(r.host for r in target.plan.ranks))
