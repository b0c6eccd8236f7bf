"""Where `mlx-cluster serve` runs: the first plan, and the next one after a rank or host dies.

--local N loses one rank (N-1 local ranks remain); a cluster file loses the host of the rank
that died. The planner (topology/plan.py, through launch_target) then chooses: tensor over fewer
ranks, or pipeline when tensor no longer divides or fits. The user's strategy and backend are
tried first, then "auto" for both (a jaccl mesh may have lost its only RDMA path: ring works).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.launch_target import LaunchTarget, PlanRefused, cluster_target, local_target
from topology.cluster_file import ClusterSpec
from topology.errors import InputError


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

    def without(self, host: str) -> ServeSource:
        """The same source minus the host that died (one rank fewer for --local)."""
        if self.local is not None:
            return replace(self, local=self.local - 1)
        assert self.cluster is not None
        kept = tuple(h for h in self.cluster.hosts if host not in (h.name, h.ssh))
        return replace(self, cluster=replace(self.cluster, hosts=kept))

    @property
    def host_count(self) -> int:
        return (
            self.local
            if self.local is not None
            else len(self.cluster.hosts if self.cluster else ())
        )


def describe(target: LaunchTarget) -> str:
    """ "tensor ×2" — what the log and the ready line show."""
    return f"{target.plan.strategy} ×{len(target.plan.ranks)}"


def lost_host(target: LaunchTarget, rank: int) -> str:
    ranks = target.plan.ranks
    return ranks[rank].host if 0 <= rank < len(ranks) else "?"
