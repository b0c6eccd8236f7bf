"""Hosts that come back: after a failover `serve` keeps asking the hosts it lost, with back-off
(RejoinWatcher), and when they answer ssh again and the plan would grow, holds new requests, lets
the running ones finish and ends the current job: launcher/serve/runner.py then starts the larger
plan. exo drops a lost host for good; here it rejoins."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from launcher.hosts.reachability import unreachable_hosts
from launcher.ranks.target import LaunchTarget, PlanRefused
from launcher.serve.failover import Failover, Log, ServeSource, describe
from launcher.serve.rank_state import RankState
from topology.errors import InputError

FIRST_CHECK_S = 5.0  # the first look at the lost hosts, then twice as long each time
MAX_CHECK_S = 60.0
DRAIN_S = 300.0  # the longest the switch waits for running requests (new ones wait meanwhile)


@dataclass(frozen=True)
class Rejoin:
    source: ServeSource  # the current hosts plus those back
    target: LaunchTarget  # the plan on them
    back: tuple[str, ...]  # the hosts that answer again


def check_intervals() -> Iterator[float]:
    """Seconds between two looks at the lost hosts: 5, 10, 20, 40, then every 60, for ever."""
    wait = FIRST_CHECK_S
    while True:
        yield wait
        wait = min(MAX_CHECK_S, wait * 2)


def lost_hosts(full: ServeSource, current: ServeSource) -> list[str]:
    if full.cluster is None or current.cluster is None:
        return []  # --local: no host is ever lost, only ranks
    kept = {h.name for h in current.cluster.hosts}
    return [h.name for h in full.cluster.hosts if h.name not in kept]


def returned(full: ServeSource, current: ServeSource, ranks_now: int) -> Rejoin | None:
    """The larger plan when lost hosts answer ssh again (probed and planned as at start), or
    None while none is back or the plan would not grow."""
    lost = set(lost_hosts(full, current))
    if not lost or full.cluster is None:
        return None
    asked = replace(full.cluster, hosts=tuple(h for h in full.cluster.hosts if h.name in lost))
    gone = {u.host.name for u in unreachable_hosts(asked)}
    back = lost - gone
    if not back:
        return None
    keep = lost - back
    grown = replace(
        current,
        cluster=replace(
            full.cluster, hosts=tuple(h for h in full.cluster.hosts if h.name not in keep)
        ),
    )
    try:
        target = grown.replan()
    except (PlanRefused, InputError):
        return None
    if len(target.plan.ranks) <= ranks_now:
        return None
    order = [h.name for h in full.cluster.hosts if h.name in back]
    return Rejoin(grown, target, tuple(order))


class RejoinWatcher:
    """Asks the lost hosts (one thread at a time) until one is back, then switches to the
    larger plan once the running requests are done (take() hands it to the runner)."""

    def __init__(
        self,
        full: ServeSource,
        failover: Failover,
        state: RankState,
        open_requests: Callable[[], int],
        log: Log,
        *,
        stop: threading.Event,
        end_job: threading.Event,
        enabled: bool = True,
    ) -> None:
        self.full = full  # every host serve was given: lost ones may come back
        self._failover, self._state = failover, state  # the hosts serving now; their status
        self._stop, self._end_job = stop, end_job  # serve is stopping; ends the current job
        self._open_requests, self._log, self._enabled = open_requests, log, enabled
        self._watching = False
        self._found: Rejoin | None = None  # the larger plan the current job was ended for

    def take(self) -> Rejoin | None:
        """The larger plan the job just ended for, once (None: it ended for another reason)."""
        found, self._found = self._found, None
        return found

    def watch(self) -> None:
        """Start asking the lost hosts, unless --no-rejoin, none is lost or a thread asks."""
        if not self._enabled or self._watching:
            return
        if not lost_hosts(self.full, self._failover.source):
            return
        self._watching = True
        threading.Thread(target=self._await_return, daemon=True, name="rejoin").start()

    def _await_return(self) -> None:
        state = self._state
        try:
            for wait_s in check_intervals():
                if self._stop.wait(wait_s) or not lost_hosts(self.full, self._failover.source):
                    return
                with state.changed:
                    ready, target = state.status == "ready", state.target
                    source = self._failover.source
                if not ready or target is None:
                    continue
                found = returned(self.full, source, len(target.plan.ranks))
                if found is not None and self._switch_when_drained(found):
                    return
        finally:
            self._watching = False

    def _switch_when_drained(self, found: Rejoin) -> bool:
        """Hold new requests, let the running ones finish (bounded), then end the job: the
        runner starts the larger plan. False when the cluster failed meanwhile."""
        back = f"{', '.join(found.back)} answers again; growing to {describe(found.target)}"
        self._log(f"{back} once the running requests are done")
        state = self._state
        state.events.add("host_back", back)
        with state.changed:
            state.rejoining = True
        end = time.monotonic() + DRAIN_S
        while self._open_requests() and time.monotonic() < end:
            with state.changed:
                if state.status != "ready" or self._stop.is_set():
                    state.rejoining = False
                    state.changed.notify_all()
                    return False
            time.sleep(0.1)
        with state.changed:
            if state.status != "ready":
                state.rejoining = False
                state.changed.notify_all()
                return False
            self._found = found
        self._end_job.set()
        return True
