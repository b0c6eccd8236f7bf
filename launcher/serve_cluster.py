"""The ranks behind `mlx-cluster serve`: start them, hand rank 0 requests, fail over.

A runner thread supervises one rank job at a time (launcher/supervisor.py, job mode "serve").
A request becomes a ticket: one JSON line on rank 0's stdin, then the `begin`/`delta`/`done`
events rank 0 tags with its id (cluster/serve_loop.py). Rank 0 decodes one request at a time;
its stdin is the queue, and at most `max_open` tickets are open. When the job ends (a rank
died, hung or made no progress) every open ticket ends with an error at once, /health turns
503, and the runner re-plans on the hosts that remain and starts again.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.launch_target import LaunchTarget, PlanRefused, rank_launches
from launcher.openai_api import GenerateRequest, new_id
from launcher.rank_jobs import Generation, build_rank_jobs
from launcher.rank_process import RankProcess
from launcher.serve_failover import ServeSource, describe
from launcher.supervisor import EXIT_BAD_INPUT, EXIT_RANK_FAILED, Deadlines, Outcome, supervise
from topology.errors import InputError

SILENT_RANK_S = 3.0  # /health: a rank heard from longer ago than this is not "answering"
Log = Callable[[str], None]


class Unavailable(Exception):
    """No cluster to send the request to right now (starting, re-planning, no plan): 503."""


class Busy(Exception):
    """max_open requests are already open: 429."""


@dataclass
class Ticket:
    id: str
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)


@dataclass
class _Change:
    """A failure being recovered from, for the "serving again" log line."""

    what: str  # "rank 1 (local1) died"
    before: str  # "tensor ×2"
    since: float


class ServeCluster:
    def __init__(
        self,
        source: ServeSource,
        model: str,
        deadlines: Deadlines,
        options: dict[str, Any],
        log: Log,
        max_open: int,
    ) -> None:
        self.source, self.model, self.deadlines = source, model, deadlines
        self.options, self.log, self.max_open = options, log, max_open
        self.stop_flag = threading.Event()
        self.changed = threading.Condition()  # status changes: cmd_serve waits on these
        self.status = "starting"  # starting | ready | restarting | failed | down | stopped
        self.reason = "the ranks are loading the model"
        self.target: LaunchTarget | None = None
        self.first_outcome: Outcome | None = None  # set when the very first start failed
        self._rank0: RankProcess | None = None
        self._heard: list[float] = []
        self._tickets: dict[str, Ticket] = {}
        self._send_lock = threading.Lock()
        self._change: _Change | None = None
        self._ready_count = 0  # how many jobs reached "ready"
        self._pids: dict[int, int] = {}  # rank -> pid, from the ranks' "started" events
        self._thread: threading.Thread | None = None

    # --- the runner -------------------------------------------------------------------------
    def start(self, target: LaunchTarget) -> None:
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self.stop_flag.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

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
            reason = outcome.failure.message().splitlines()[0] if outcome.failure else "stopped"
            ever_ready = self._ready_count > 0
            self._set_status("down" if ever_ready else "failed", reason, fail_open=True)
            if self.stop_flag.is_set():
                return self._set_status("stopped", "mlx-cluster serve is stopping")
            if not ever_ready:  # the first start failed: cmd_serve reports it and exits
                self.first_outcome = outcome
                return self._notify()
            if outcome.exit_code == EXIT_BAD_INPUT or outcome.failure is None:
                return self.log(f"cannot restart the ranks ({reason}); answering 503")
            rank = outcome.failure.rank
            self.log(f"{reason}; re-planning on the hosts that remain")
            change = self._change or _Change("", describe(target), time.monotonic())
            lost, unreachable = self.source.lost_hosts(target, rank, dict(self._pids))
            if unreachable:
                what = f"{', '.join(lost)} stopped answering"
            else:
                what = f"rank {rank} ({lost[0]}) died"
            self._change = replace(change, what=what)
            self.source = self.source.without(lost)
            try:
                target = self.source.replan()
            except (PlanRefused, InputError) as e:
                self._set_status("down", f"no plan fits on the hosts that remain: {e}")
                return self.log(f"no plan fits on the hosts that remain: {e}; answering 503")
            if self.stop_flag.is_set():
                return self._set_status("stopped", "mlx-cluster serve is stopping")
            self.log(f"new plan: {describe(target)} ({target.plan.reason}); starting the ranks")
            self._set_status("restarting", f"restarting as {describe(target)} after: {reason}")

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
        jobs = [replace(j, mode="serve", options=dict(self.options)) for j in jobs]
        with self.changed:
            self.target = target
            self._heard = [time.monotonic()] * len(jobs)
            self._pids = {}
        return supervise(
            rank_launches(target, jobs),
            on_text=lambda _text: None,  # serve ranks write nothing on stdout
            on_event=self._on_event,
            deadlines=self.deadlines,
            on_started=self._on_started,
            stop=self.stop_flag,
        )

    def _on_started(self, ranks: list[RankProcess]) -> None:
        with self.changed:
            self._rank0 = ranks[0]

    def _on_event(self, rank: int, event: dict[str, Any]) -> None:
        name = event.get("event")
        with self.changed:
            if rank < len(self._heard):
                self._heard[rank] = time.monotonic()
            if name == "started" and isinstance(event.get("pid"), int):
                self._pids[rank] = event["pid"]
            ticket = self._tickets.get(str(event.get("id"))) if rank == 0 else None
            if ticket is not None and name in ("begin", "delta", "done", "request_error"):
                ticket.events.put(event)
                if name in ("done", "request_error"):
                    del self._tickets[ticket.id]
        if name == "ready" and rank == 0:
            self._ready()

    def _ready(self) -> None:
        assert self.target is not None
        now = describe(self.target)
        self._ready_count += 1
        self._set_status("ready", f"serving as {now}")
        if self._change is not None:
            took = time.monotonic() - self._change.since
            self.log(
                f"{self._change.what}; re-planned {self._change.before} → {now} "
                f"in {took:.1f} s; serving again"
            )
            self._change = None

    def _set_status(self, status: str, reason: str, fail_open: bool = False) -> None:
        with self.changed:
            self.status, self.reason = status, reason
            if status != "ready":
                self._rank0 = None
            if fail_open:  # every open request ends now, with the reason
                for ticket in self._tickets.values():
                    ticket.events.put({"event": "failed", "status": 503, "message": reason})
                self._tickets.clear()
            self.changed.notify_all()

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    # --- what the HTTP side calls -----------------------------------------------------------
    def submit(self, request: GenerateRequest) -> Ticket:
        """Queue a request on rank 0; Unavailable / Busy when it cannot be taken now."""
        with self.changed:
            rank0 = self._rank0
            if self.status != "ready" or rank0 is None:
                raise Unavailable(self.reason)
            if len(self._tickets) >= self.max_open:
                raise Busy(f"{self.max_open} requests are already open (--max-concurrency)")
            ticket = Ticket(new_id(request.kind))
            self._tickets[ticket.id] = ticket
        line = request.rank_line(ticket.id, seed=random.randrange(2**31))
        with self._send_lock:  # one writer at a time: lines must not interleave
            sent = rank0.send_line(line)
        if not sent:
            with self.changed:
                self._tickets.pop(ticket.id, None)
            raise Unavailable("the ranks are stopping")
        return ticket

    def events(self, ticket: Ticket) -> Iterator[dict[str, Any]]:
        """The ticket's events until done/request_error/failed. Waiting in the queue is bounded
        by the cluster (a failure fails every ticket); once decoding, a silence longer than the
        supervisor's own deadline ends it too."""
        quiet_s = self.deadlines.rank_timeout_s + self.deadlines.grace_s + 5.0
        begun, last = False, time.monotonic()
        while True:
            try:
                event = ticket.events.get(timeout=1.0)
            except queue.Empty:
                if begun and time.monotonic() - last > quiet_s:
                    with self.changed:
                        self._tickets.pop(ticket.id, None)
                    message = f"no answer from the ranks for {quiet_s:.0f} s"
                    yield {"event": "failed", "status": 503, "message": message}
                    return
                continue
            last = time.monotonic()
            begun = begun or event.get("event") == "begin"
            yield event
            if event.get("event") in ("done", "request_error", "failed"):
                return

    def health(self) -> tuple[bool, dict[str, Any]]:
        with self.changed:
            if self.status != "ready" or self.target is None:
                return False, {"status": self.status, "reason": self.reason}
            now = time.monotonic()
            silent = [r for r, t in enumerate(self._heard) if now - t > SILENT_RANK_S]
            if silent:
                reason = f"rank(s) {silent} silent for more than {SILENT_RANK_S:.0f} s"
                return False, {"status": "unresponsive", "reason": reason}
            plan = self.target.plan
            return True, {
                "status": "ok",
                "strategy": plan.strategy,
                "backend": self.target.backend,
                "ranks": len(plan.ranks),
                "hosts": [r.host for r in plan.ranks],
                "open_requests": len(self._tickets),
            }
