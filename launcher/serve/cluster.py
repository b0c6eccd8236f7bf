"""What `mlx-cluster serve`'s HTTP side talks to: the ranks (runner.py, their state in
rank_state.py) and the requests open on them (tickets.py). A request becomes a ticket and one
JSON line on rank 0's stdin; a client that goes away withdraws it with one `{"cancel": id}` line;
/health reports whether the ranks are serving and answering.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any

from launcher.ranks.target import LaunchTarget
from launcher.serve.openai_api import GenerateRequest, new_id
from launcher.serve.runner import RankRunner
from launcher.serve.tickets import Event, Ticket, Tickets, Unavailable

REJOIN_WAIT_S = 120.0  # a request arriving while the ranks grow waits at most this long
SILENT_RANK_S = 3.0  # /health: a rank heard from longer ago than this is not "answering"


class ServeCluster:
    def __init__(self, runner: RankRunner, tickets: Tickets) -> None:
        self.runner, self.tickets = runner, tickets
        self.state = runner.state
        self.deadlines = runner.deadlines
        self._send_lock = threading.Lock()

    def start(self, target: LaunchTarget) -> None:
        self.runner.start(target)

    def stop(self, timeout_s: float) -> None:
        self.runner.stop(timeout_s)

    def submit(self, request: GenerateRequest, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue a request on rank 0 (its events go to `loop`); Unavailable / Busy (tickets.py)
        when it cannot be taken. Blocking (a pipe write): the HTTP side calls it off its loop."""
        state = self.state
        with state.changed:
            # A host came back: new requests wait (bounded) while the running ones finish and
            # the ranks restart on the larger plan.
            if state.rejoining:
                state.changed.wait_for(lambda: not state.rejoining, REJOIN_WAIT_S)
            rank0 = state.rank0
            if state.status != "ready" or rank0 is None:
                raise Unavailable(state.reason)
            ticket = self.tickets.open(new_id(request.kind), loop, choices=request.n)
        line = request.rank_line(ticket.id, seed=random.randrange(2**31))
        with self._send_lock:  # one writer at a time: lines must not interleave
            sent = rank0.send_line(line)
        if not sent:
            self.tickets.drop(ticket.id)
            raise Unavailable("the ranks are stopping")
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: forget the ticket and tell rank 0 to drop the sequence (it
        leaves the batch within one step). Nothing to send when the request already ended."""
        if not self.tickets.drop(ticket.id):
            return
        state = self.state
        with state.changed:
            rank0 = state.rank0 if state.status == "ready" else None
        if rank0 is None:
            return  # the ranks are gone or restarting: the request went with them
        line = json.dumps({"cancel": ticket.id}, separators=(",", ":")) + "\n"
        with self._send_lock:
            rank0.send_line(line)

    def quiet_s(self) -> float:
        """How long a begun request may hear nothing: only a backstop, well past the
        supervisor's deadlines (which learn the job's pace and fail every request at once)."""
        d = self.deadlines
        return 2 * max(d.load_timeout_s, d.stall_timeout_s) + d.grace_s

    async def next_event(self, ticket: Ticket) -> Event:
        """The ticket's next event (a `failed` one after the silence bound)."""
        return await self.tickets.next_event(ticket, self.quiet_s())

    def ranks_up(self) -> int:
        """The current plan's rank count while serving, else 0 (for /metrics)."""
        state = self.state
        with state.changed:
            target = state.target
            return len(target.plan.ranks) if state.status == "ready" and target else 0

    def health(self) -> tuple[bool, dict[str, Any]]:
        state = self.state
        with state.changed:
            target = state.target
            if state.status != "ready" or target is None:
                return False, {"status": state.status, "reason": state.reason}
            now = time.monotonic()
            silent = [r for r, t in enumerate(state.heard) if now - t > SILENT_RANK_S]
            if silent:
                reason = f"rank(s) {silent} silent for more than {SILENT_RANK_S:.0f} s"
                return False, {"status": "unresponsive", "reason": reason}
            plan = target.plan
            return True, {
                "status": "ok",
                "strategy": plan.strategy,
                "backend": target.backend,
                "ranks": len(plan.ranks),
                "hosts": [r.host for r in plan.ranks],
                "open_requests": len(self.tickets),
                # The KV memory budget admission holds every rank to (topology/planning/serving.py).
                "memory": self.runner.limits.memory(target).to_json(),
            }
