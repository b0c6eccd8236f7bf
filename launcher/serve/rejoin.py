"""Hosts that come back: after a failover `serve` keeps asking the hosts it lost, with back-off,
and when they answer ssh again offers the larger plan (launcher/serve/runner.py switches to it
once the running requests are done). exo drops a lost host for good; here it rejoins."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from launcher.hosts.reachability import unreachable_hosts
from launcher.ranks.target import LaunchTarget, PlanRefused
from launcher.serve.failover import ServeSource
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
