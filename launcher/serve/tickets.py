"""The requests open on the ranks: one ticket each, fed by rank 0's events.

A ticket's events are `begin`/`delta`/`tool_call`/`done`/`request_error` as rank 0 tags them
with the ticket's id, or one `failed` when the ranks go (fail_all); a request of n choices ends
with its n-th `done`. Events arrive on supervisor threads (route); each ticket hands them to the
HTTP event loop through loop.call_soon_threadsafe into an asyncio.Queue, so no thread waits per
request and the ranks never wait for a slow client.
At most `max_open` tickets are open at once (decoding + waiting on rank 0); beyond, Busy (429).
Unavailable is the HTTP side's 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

Event = dict[str, Any]
REQUEST_EVENTS = ("begin", "prompt_progress", "delta", "tool_call", "done", "request_error")
FINAL_EVENTS = ("done", "request_error", "failed")


class Unavailable(Exception):
    """No cluster to send the request to right now (starting, re-planning, no plan): 503."""


class Busy(Exception):
    """max_open requests are already open: 429."""


class Latencies(Protocol):
    """Where a ticket's token timings go (launcher/serve/metrics.py)."""

    def first_token(self, seconds: float) -> None: ...

    def inter_token(self, seconds: float) -> None: ...


@dataclass(eq=False)
class Ticket:
    id: str
    loop: asyncio.AbstractEventLoop  # the HTTP event loop that awaits this ticket's events
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    opened: float = field(default_factory=time.monotonic)
    last_delta: float | None = None  # set on the routing thread only
    begun: bool = False  # set by the awaiting side only
    choices: int = 1  # `done` events that end the request (one per choice)
    ended: int = 0  # `done` events routed so far (on the routing thread, under the lock)

    def put(self, event: Event) -> None:
        """From any thread: the event joins the queue on the loop's thread."""
        # A closed loop means serve is shutting down: nobody is left to read the event.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Tickets:
    def __init__(self, max_open: int, busy: str = "", latencies: Latencies | None = None) -> None:
        self.max_open = max_open
        self._busy = busy or f"{max_open} requests are already open"
        self._latencies = latencies
        self._open: dict[str, Ticket] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def __contains__(self, ticket_id: object) -> bool:
        with self._lock:
            return ticket_id in self._open

    def open(self, ticket_id: str, loop: asyncio.AbstractEventLoop, choices: int = 1) -> Ticket:
        with self._lock:
            if len(self._open) >= self.max_open:
                raise Busy(self._busy)
            ticket = self._open[ticket_id] = Ticket(ticket_id, loop, choices=choices)
            return ticket

    def drop(self, ticket_id: str) -> bool:
        """Forget a ticket; True when it was still open."""
        with self._lock:
            return self._open.pop(ticket_id, None) is not None

    def route(self, event: Event) -> None:
        """Hand one of rank 0's request events to its ticket (unknown ids are ignored: a
        cancelled request may still be answered once)."""
        name = event.get("event")
        if name not in REQUEST_EVENTS:
            return
        with self._lock:
            ticket = self._open.get(str(event.get("id")))
            if ticket is None:
                return
            if name == "done":
                ticket.ended += 1
            if name in FINAL_EVENTS and (name != "done" or ticket.ended >= ticket.choices):
                del self._open[ticket.id]
        if name == "delta":
            self._time(ticket)
        ticket.put(event)

    def _time(self, ticket: Ticket) -> None:
        now = time.monotonic()
        if self._latencies is not None:
            if ticket.last_delta is None:
                self._latencies.first_token(now - ticket.opened)
            else:
                self._latencies.inter_token(now - ticket.last_delta)
        ticket.last_delta = now

    def fail_all(self, reason: str) -> None:
        """Every open request ends now, with the reason (the ranks are gone)."""
        with self._lock:
            tickets = list(self._open.values())
            self._open.clear()
        for ticket in tickets:
            ticket.put({"event": "failed", "status": 503, "message": reason})

    async def next_event(self, ticket: Ticket, quiet_s: float) -> Event:
        """The ticket's next event. Waiting on rank 0's queue is bounded by the cluster (a
        failure fails every ticket); once begun, a silence longer than quiet_s ends it."""
        try:
            if ticket.begun:
                event = await asyncio.wait_for(ticket.events.get(), quiet_s)
            else:
                event = await ticket.events.get()
        except TimeoutError:
            self.drop(ticket.id)
            message = f"no answer from the ranks for {quiet_s:.0f} s"
            return {"event": "failed", "status": 503, "message": message}
        ticket.begun = ticket.begun or event.get("event") in ("begin", "delta", "tool_call")
        return event
