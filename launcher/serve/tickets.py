"""The requests open on the ranks: one ticket each, fed by rank 0's events.

A ticket's events are `begin`/`delta`/`done`/`request_error` as rank 0 tags them with the
ticket's id (cluster/serve/loop.py), or one `failed` when the ranks go (fail_all). At most
`max_open` tickets are open at once; the HTTP side turns Busy into 429 and Unavailable into 503.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]
FINAL_EVENTS = ("done", "request_error", "failed")


class Unavailable(Exception):
    """No cluster to send the request to right now (starting, re-planning, no plan): 503."""


class Busy(Exception):
    """max_open requests are already open: 429."""


@dataclass
class Ticket:
    id: str
    events: queue.Queue[Event] = field(default_factory=queue.Queue)


class Tickets:
    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self._open: dict[str, Ticket] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def open(self, ticket_id: str) -> Ticket:
        with self._lock:
            if len(self._open) >= self.max_open:
                raise Busy(f"{self.max_open} requests are already open (--max-concurrency)")
            ticket = self._open[ticket_id] = Ticket(ticket_id)
            return ticket

    def drop(self, ticket_id: str) -> None:
        with self._lock:
            self._open.pop(ticket_id, None)

    def route(self, event: Event) -> None:
        """Hand one of rank 0's request events to its ticket (unknown ids are ignored)."""
        name = event.get("event")
        if name not in ("begin", "delta", "done", "request_error"):
            return
        with self._lock:
            ticket = self._open.get(str(event.get("id")))
            if ticket is None:
                return
            ticket.events.put(event)
            if name in FINAL_EVENTS:
                del self._open[ticket.id]

    def fail_all(self, reason: str) -> None:
        """Every open request ends now, with the reason (the ranks are gone)."""
        with self._lock:
            for ticket in self._open.values():
                ticket.events.put({"event": "failed", "status": 503, "message": reason})
            self._open.clear()

    def events(self, ticket: Ticket, quiet_s: float) -> Iterator[Event]:
        """The ticket's events until a final one. Waiting in the queue is bounded by the cluster
        (a failure fails every ticket); once decoding, a silence longer than quiet_s ends it."""
        begun, last = False, time.monotonic()
        while True:
            try:
                event = ticket.events.get(timeout=1.0)
            except queue.Empty:
                if begun and time.monotonic() - last > quiet_s:
                    self.drop(ticket.id)
                    message = f"no answer from the ranks for {quiet_s:.0f} s"
                    yield {"event": "failed", "status": 503, "message": message}
                    return
                continue
            last = time.monotonic()
            begun = begun or event.get("event") == "begin"
            yield event
            if event.get("event") in FINAL_EVENTS:
                return
