"""Is the job alive, and is it moving? Two questions with their own deadlines.

Alive: every rank reports (events, a heartbeat each second) and so does its guard process
(cluster/rank_guard.py, no MLX in it: it keeps reporting while the rank is frozen), and the
guards heartbeat the rank's links to its peers. So a host that goes quiet (unplugged, cut off),
a rank that goes quiet on a live host (SIGSTOP, hung) and a link that fails between two live
hosts are each caught within `rank_timeout_s` and named for what they are.

Moving: the job's own pace sets the progress deadline — a multiple of the longest wait between
two signs of progress seen so far, never below `stall_timeout_s` — so slow work (a long prefill
chunk, a slow decode step) is never taken for a failure, and a collective stuck among live
ranks is still caught.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Signs of life, not of progress.
QUIET_EVENTS = ("heartbeat", "started", "guard", "link_down", "link_unwatched")
STALL_FACTOR = 4.0  # progress may pause this many times the longest pause seen so far
LINK_CONFIRM_S = 1.0  # a reported link must stay down this long while both hosts still answer
HOST_ANSWERS_S = 2.0  # "still answers": its guard was heard this recently (it says so every 1 s)


@dataclass(frozen=True)
class Deadlines:
    rank_timeout_s: float = 5.0  # silence of a rank, its host or one of its links
    load_timeout_s: float = 300.0  # silence or no progress before the model is loaded
    stall_timeout_s: float = 120.0  # no progress while decoding: the floor of the learned pace
    grace_s: float = 2.0  # SIGTERM → SIGKILL


@dataclass(frozen=True)
class LinkDown:
    rank: int
    peer: int
    addr: str
    peer_addr: str
    at: float


@dataclass
class Liveness:
    """When each rank and each rank's guard was last heard from, the links reported down, and
    the job's progress."""

    last_sign: list[float]
    last_guard: list[float | None]
    loading: list[bool]
    last_progress: float
    longest_gap: float = 0.0  # the longest pause between two signs of progress once loaded
    links_down: list[LinkDown] = field(default_factory=list)

    @classmethod
    def start(cls, n: int, now: float) -> Liveness:
        return cls([now] * n, [None] * n, [True] * n, now)

    def heard(self, rank: int, event: dict[str, Any] | None, now: float) -> None:
        name = event.get("event") if event is not None else "text"
        if name == "guard":
            self.last_guard[rank] = now
            return
        self.last_sign[rank] = now
        ev = event or {}
        if name == "link_down":
            link = LinkDown(rank, int(ev.get("peer", -1)), str(ev.get("addr", "")),
                            str(ev.get("peer_addr", "")), now)  # fmt: skip
            self.links_down.append(link)
        if name in QUIET_EVENTS:
            return
        if self.loaded:
            self.longest_gap = max(self.longest_gap, now - self.last_progress)
        self.last_progress = now
        if name in ("loaded", "decode", "ready"):  # the stage cluster.rank enters once loaded
            self.loading[rank] = False
        if name in ("text", "result") or (name == "progress" and ev.get("stage") == "decode"):
            self.loading = [False] * len(self.loading)

    @property
    def loaded(self) -> bool:
        return not any(self.loading)

    def answered(self, rank: int) -> float:
        """When the rank's host last said anything (the rank or its guard)."""
        guard = self.last_guard[rank]
        return self.last_sign[rank] if guard is None else max(guard, self.last_sign[rank])

    def stall_allowance(self, d: Deadlines) -> float:
        if not self.loaded:
            return d.load_timeout_s
        return max(d.stall_timeout_s, STALL_FACTOR * self.longest_gap)


def overdue(
    clock: Liveness, d: Deadlines, alive: list[int], hosts: list[str], now: float
) -> tuple[int, str] | None:
    """The rank to blame and why, when a deadline has passed (`hosts`: each rank's host)."""
    for r in alive:  # a host gone quiet: neither the rank nor its guard says anything
        quiet = now - clock.answered(r)
        if clock.last_guard[r] is not None and quiet > d.rank_timeout_s:
            why = "its host is unplugged, cut off or down"
            return r, f"stopped answering for {quiet:.1f} s ({why})"
    for link in clock.links_down:  # a link down between two hosts that both still answer
        ends = (link.rank, link.peer)
        if link.peer not in alive or link.rank not in alive or now - link.at < LINK_CONFIRM_S:
            continue
        if all(now - clock.answered(r) < HOST_ANSWERS_S for r in ends):
            return link.rank, (
                f"lost its link to rank {link.peer} on {hosts[link.peer]} "
                f"({link.addr or '?'} ↔ {link.peer_addr or '?'}): no heartbeat across it while "
                "both hosts still answer; check that cable or network link"
            )
    for r in alive:  # a rank gone quiet on a host that still answers
        silent = now - clock.last_sign[r]
        allowance = d.load_timeout_s if clock.loading[r] else d.rank_timeout_s
        guard = clock.last_guard[r]
        if guard is not None and now - guard > HOST_ANSWERS_S:
            continue  # the host is going quiet too: the first rule names it in a moment
        if silent > allowance:
            still = " while its host still answers" if guard is not None else ""
            return r, f"sent nothing for {silent:.1f} s{still} (stopped or hung)"
    stalled = now - clock.last_progress
    allowance = clock.stall_allowance(d)
    if alive and stalled > allowance:
        quietest = min(alive, key=lambda r: clock.last_sign[r])
        return quietest, (
            f"made no progress for {stalled:.1f} s (allowed: {allowance:.0f} s from the job's "
            "pace; stuck in a collective?)"
        )
    return None
