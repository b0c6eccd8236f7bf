"""What happened to the serving cluster, newest first: ranks lost, failovers, new plans, hosts
back, model copies with their progress, and the last failure message in full.

The runner, failover and rejoin code add an entry where they write the matching log line; rank
events (a copy's progress, its end) come through RankEvents. A copy in progress is one entry
updated in place, so a fast-ticking copy does not push the rest out of the log.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

MAX_EVENTS = 200
_MB = 1e6


@dataclass(frozen=True)
class ClusterEvent:
    seq: int
    at: float  # wall clock (time.time()), for the page's clock
    kind: str  # started | serving | rank_lost | failover | plan | restart | host_back | copy
    message: str
    progress: float | None = None  # a copy's fraction done

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seq": self.seq, "at": self.at, "kind": self.kind}
        out["message"] = self.message
        if self.progress is not None:
            out["progress"] = round(self.progress, 4)
        return out


def _size(n: int) -> str:
    return f"{n / _MB:.1f} MB"


class EventLog:
    """The newest MAX_EVENTS events; thread-safe (supervisor, runner and rejoin threads add)."""

    def __init__(self) -> None:
        self._events: deque[ClusterEvent] = deque(maxlen=MAX_EVENTS)
        self._copies: dict[tuple[int, str], ClusterEvent] = {}  # (rank, host) -> its entry
        self._lock = threading.Lock()
        self._seq = 0
        self.last_failure: dict[str, Any] | None = None  # {"at", "message"}: the whole text

    def add(self, kind: str, message: str) -> None:
        with self._lock:
            self._append(kind, message)

    def failure(self, message: str) -> None:
        """A job ended by a failure: one event with its first line, and the whole message."""
        with self._lock:
            self.last_failure = {"at": time.time(), "message": message}
            self._append("rank_lost", message.splitlines()[0] if message else "a rank failed")

    def _append(self, kind: str, message: str, progress: float | None = None) -> ClusterEvent:
        self._seq += 1
        event = ClusterEvent(self._seq, time.time(), kind, message, progress)
        self._events.append(event)
        return event

    def copy_step(self, rank: int, host: str, event: dict[str, Any]) -> None:
        """A rank's `progress` event of stage `download`: its copy's entry, updated in place."""
        done, total = event.get("done"), event.get("total")
        received, expected = event.get("received"), event.get("expected")
        if not (isinstance(done, int) and isinstance(total, int) and total > 0):
            return
        text = f"rank {rank} ({host}) copying the model: {done}/{total} files"
        fraction = done / total
        if isinstance(received, int) and isinstance(expected, int) and expected > 0:
            text += f", {_size(received)} of {_size(expected)}"
            fraction = received / expected
        with self._lock:
            self._update_copy((rank, host), text, min(1.0, fraction))

    def copied(self, rank: int, host: str, copied: dict[str, Any]) -> None:
        """The rank's `decode` event: what its copy fetched in all (nothing when none)."""
        files, size = copied.get("files"), copied.get("bytes")
        if not isinstance(files, int) or files <= 0 or not isinstance(size, int):
            return
        text = f"rank {rank} ({host}) copied {files} files ({_size(size)}) of the model"
        with self._lock:
            self._update_copy((rank, host), text, 1.0)
            del self._copies[(rank, host)]

    def _update_copy(self, key: tuple[int, str], text: str, progress: float) -> None:
        old = self._copies.get(key)
        if old is None or old not in self._events:
            self._copies[key] = self._append("copy", text, progress)
            return
        new = replace(old, message=text, progress=progress, at=time.time())
        index = self._events.index(old)
        self._events[index] = self._copies[key] = new

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            newest_first = [e.to_json() for e in reversed(self._events)]
            return {"items": newest_first, "last_failure": self.last_failure}
