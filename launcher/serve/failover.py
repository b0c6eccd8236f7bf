"""Where `mlx-cluster serve` runs: the first plan, and the next one after a rank or host dies.

--local N loses one rank (N-1 local ranks remain); a cluster file loses the hosts that stopped
answering ssh or, when all answer, the host of the rank that failed. The planner
(topology/planning/plan.py, through launcher/ranks/target.py) then chooses: tensor over fewer
ranks, or pipeline when tensor no longer divides or fits. The user's strategy and backend are tried
first, then "auto" for both (a jaccl mesh may have lost its only RDMA path: ring works). When no
host would remain or no plan fits, Failover restarts on every host again, after a back-off.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from launcher.hosts.reachability import ANSWER_TIMEOUT_S, unreachable_hosts
from launcher.hosts.ssh import is_local, ssh_argv
from launcher.ranks.target import LaunchTarget, PlanRefused, cluster_target, local_target
from launcher.serve.dashboard.events import EventLog
from topology.cluster_file import ClusterSpec, HostSpec
from topology.errors import InputError

Log = Callable[[str], None]
MAX_BACKOFF_S = 30.0  # restarts on the same hosts wait 1, 2, 4 … s, then this long each time
# Kill a leftover rank by pid, but only if that pid is still a rank (ps works on macOS and Linux).
_KILL_RANK = 'ps -p "$1" -o command= | grep -q cluster.rank && kill -9 "$1"; true'


@dataclass(frozen=True)
class ServeSource:
    """What serve was asked to run on: N local ranks or a cluster file's hosts."""

    model: str
    strategy: str | None = None
    backend: str | None = None
    local: int | None = None
    cluster: ClusterSpec | None = None

    def first_target(self) -> LaunchTarget:
        """The plan with the user's choices; PlanRefused / InputError as launch would."""
        return self._plan(self.strategy, self.backend)

    def replan(self) -> LaunchTarget:
        """The user's choices if they still fit, else whatever the planner finds."""
        tried: list[str] = []
        attempts = [(self.strategy, self.backend), ("auto", "auto")]
        for strategy, backend in dict.fromkeys(attempts):
            try:
                return self._plan(strategy, backend)
            except (PlanRefused, InputError) as e:
                tried.append(str(e))
        raise PlanRefused("; ".join(dict.fromkeys(tried)))

    def _plan(self, strategy: str | None, backend: str | None) -> LaunchTarget:
        if self.local is not None:
            if self.local < 1:
                raise PlanRefused("no local rank remains")
            return local_target(self.local, self.model, strategy or "auto")
        assert self.cluster is not None
        if not self.cluster.hosts:
            raise PlanRefused(f"{self.cluster.source}: no host remains")
        return cluster_target(self.cluster, self.model, strategy, backend)

    def has_hosts(self) -> bool:
        if self.local is not None:
            return self.local >= 1
        return self.cluster is not None and bool(self.cluster.hosts)

    def without(self, hosts: list[str]) -> ServeSource:
        """The same source minus the hosts that died (one rank fewer for --local)."""
        if self.local is not None:
            return replace(self, local=self.local - 1)
        assert self.cluster is not None
        kept = tuple(h for h in self.cluster.hosts if h.name not in hosts)
        return replace(self, cluster=replace(self.cluster, hosts=kept))

    def lost_hosts(
        self, target: LaunchTarget, rank: int, pids: dict[int, int]
    ) -> tuple[list[str], bool]:
        """The hosts to leave out after `rank` failed (and whether they stopped answering ssh),
        with every other rank put down first.

        Hosts that no longer answer ssh are the likely cause whichever rank a deadline blamed
        (a peer stuck in a collective with a vanished host looks just as silent). A remote rank
        frozen inside an MLX call that holds the GIL cannot act on its stdin EOF, so each one
        on a host that still answers is killed by pid before its host is used again.
        """
        blamed = lost_host(target, rank)
        if self.cluster is None:
            return [blamed], False
        on_target = {r.host for r in target.plan.ranks}
        hosts = [h for h in self.cluster.hosts if h.name in on_target]
        gone = {u.host.name for u in unreachable_hosts(replace(self.cluster, hosts=tuple(hosts)))}
        by_name = {h.name: h for h in hosts}
        leftovers = [
            (by_name[r.host], pids[r.rank])
            for r in target.plan.ranks
            if r.rank in pids and r.host in by_name and r.host not in gone
        ]
        with ThreadPoolExecutor(max_workers=max(1, len(leftovers))) as pool:
            list(pool.map(lambda hp: self._kill(hp[0], hp[1]), leftovers))
        return (sorted(gone), True) if gone else ([blamed], False)

    def _kill(self, host: HostSpec, pid: int) -> None:
        if is_local(host) or self.cluster is None:
            return  # local ranks got SIGKILL from the supervisor
        argv = ssh_argv(self.cluster, host, ["sh", "-c", _KILL_RANK, "sh", str(pid)])
        # Unreachable after all: nothing more can be done from here.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=ANSWER_TIMEOUT_S
            )


def describe(target: LaunchTarget) -> str:
    """ "tensor ×2" — what the log and the ready line show."""
    return f"{target.plan.strategy} ×{len(target.plan.ranks)}"


def lost_host(target: LaunchTarget, rank: int) -> str:
    ranks = target.plan.ranks
    return ranks[rank].host if 0 <= rank < len(ranks) else "?"


@dataclass(frozen=True)
class PlanChange:
    """A failure or a return being recovered from, for the log line once serving again."""

    what: str  # "rank 1 (local1) died", "h2 is back"
    before: str  # "tensor ×2"
    since: float  # time.monotonic() when it began
    back: bool = False  # a host came back: the plan grows

    def done(self, now: str) -> str:
        """The log line once the ranks serve as `now` ("tensor ×3")."""
        took = time.monotonic() - self.since
        if self.back:
            return f"{self.what}: {self.before} → {now} in {took:.1f} s"
        return f"{self.what}; re-planned {self.before} → {now} in {took:.1f} s; serving again"


class Failover:
    """After a job failed: which hosts to leave out, and the plan to restart on."""

    def __init__(
        self,
        source: ServeSource,
        log: Log,
        stop: threading.Event,
        set_status: Callable[[str, str], None],
        events: EventLog | None = None,
    ) -> None:
        self.source = source  # the hosts serving now: fewer after a failover, more after a rejoin
        self._log, self._stop, self._set_status = log, stop, set_status
        self._events = events or EventLog()
        self._restarts = 0  # restarts on the same hosts since the last ready (the back-off)

    def serving(self) -> None:
        """The ranks are ready again: the next failure's back-off starts over."""
        self._restarts = 0

    def lost(self, target: LaunchTarget, rank: int, pids: dict[int, int]) -> tuple[list[str], str]:
        """The hosts to leave out after `rank` failed, and what happened to them (for the log)."""
        lost, unreachable = self.source.lost_hosts(target, rank, pids)
        if unreachable:
            return lost, f"{', '.join(lost)} stopped answering"
        return lost, f"rank {rank} ({lost[0]}) died"

    def next_target(self, lost: list[str], reason: str) -> LaunchTarget | None:
        """The plan to restart on: the hosts that remain, or, when none would (the last host,
        `--local 1`) or no plan fits on them, every host again after a back-off, for as long as
        it takes (a failed job is never the end of serving). None once serve is stopping."""
        fewer = self.source.without(lost)
        if fewer.has_hosts():
            self._log(f"{reason}; re-planning on the hosts that remain")
            try:
                target = fewer.replan()
                self.source = fewer
                return target
            except (PlanRefused, InputError) as e:
                self._log(f"no plan fits on the hosts that remain ({e})")
        while True:
            self._restarts += 1
            wait_s = min(MAX_BACKOFF_S, 2.0 ** (self._restarts - 1))
            self._log(f"{reason}; restarting on the same hosts in {wait_s:.0f} s")
            self._events.add("restart", f"restarting on the same hosts in {wait_s:.0f} s")
            self._set_status("restarting", f"restarting in {wait_s:.0f} s after: {reason}")
            if self._stop.wait(wait_s):
                return None
            try:
                return self.source.replan()
            except (PlanRefused, InputError) as e:
                reason = f"no plan fits: {e}"
