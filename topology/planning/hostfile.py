"""The plan as an mlx.launch hostfile: `mlx.launch --hostfile hostfile.json -- python x.py`.

Format (mlx/_distributed_utils/common.py, Hostfile.from_file; checks in launch.py):
{"backend": B, "envs": ["K=V", ...], "hosts": [{"ssh": name, "ips": [...], "rdma": [...]}]}
- hosts are in rank order; mlx.launch runs a host whose ssh is 127.0.0.1 locally, others over ssh.
- ring: ips = the address each rank listens on (topology/addresses.py); rdma unused ([]).
- jaccl: rdma is an N×N matrix row: null on the diagonal, `rdma_<enX>` of this host's end of
  the cable to rank j, or a list of them when several cables join the pair (same cable order
  on both ends: jaccl pairs the k-th device of each side). The coordinator is rank 0's ips[0].
- jaccl-ring: devices only towards the two ring neighbours (i-1, i+1), null elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from topology.facts import Link

if TYPE_CHECKING:
    from topology.planning.types import Plan

RDMA_BACKENDS = ("jaccl", "jaccl-ring")


def _devices(a: str, b: str, links: Sequence[Link]) -> str | list[str] | None:
    """a's RDMA devices towards b, in a cable order both ends agree on."""
    low, high = sorted((a, b))
    cables = sorted(
        (k for k in links if {k.a, k.b} == {a, b} and k.rdma and k.iface_of(a)),
        key=lambda k: (k.port_of(low), k.port_of(high)),
    )
    names = [f"rdma_{k.iface_of(a)}" for k in cables]
    if not names:
        return None
    return names[0] if len(names) == 1 else names


def rdma_matrix(hosts: Sequence[str], links: Sequence[Link], ring: bool) -> list[list[Any]]:
    """Row i = rank i's device towards each rank j (null for itself and non-neighbours)."""
    n = len(hosts)
    rows = []
    for i, a in enumerate(hosts):
        peers = {(i - 1) % n, (i + 1) % n} if ring else set(range(n))
        rows.append(
            [_devices(a, b, links) if j != i and j in peers else None for j, b in enumerate(hosts)]
        )
    return rows


def missing_devices(
    hosts: Sequence[str], matrix: Sequence[Sequence[Any]], ring: bool
) -> list[tuple[str, str]]:
    """(host, peer) pairs needing a device the matrix lacks (the rule mlx.launch applies)."""
    n = len(hosts)
    out = []
    for i, row in enumerate(matrix):
        peers = ((i - 1) % n, (i + 1) % n) if ring else range(n)
        out += [(hosts[i], hosts[j]) for j in peers if j != i and row[j] is None]
    return out


def hostfile_json(
    plan: Plan, links: Sequence[Link] = (), envs: Sequence[str] = ()
) -> dict[str, Any]:
    """The hostfile for a valid plan (ValueError when the plan has no ranks)."""
    if not plan.ranks:
        raise ValueError("no hostfile for a plan without ranks")
    backend = plan.backend or "ring"
    n = len(plan.ranks)
    names = [r.host for r in plan.ranks]
    matrix: list[list[Any]] = [[] for _ in plan.ranks]
    if backend in RDMA_BACKENDS and n > 1:
        matrix = rdma_matrix(names, links, ring=backend == "jaccl-ring")
    hosts = [
        {"ssh": r.ssh or r.host, "ips": [r.ip] if r.ip else [], "rdma": row}
        for r, row in zip(plan.ranks, matrix, strict=True)
    ]
    return {"backend": backend, "envs": list(envs), "hosts": hosts}
