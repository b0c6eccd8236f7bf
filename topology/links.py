"""The Thunderbolt link graph: which cables join which Macs, and what shapes they form.

A cable is recognised when host A's port lists host B's bus uuid as its peer AND B's port lists
A's bus uuid (the two ends see each other). One end alone is an asymmetric (one-sided) sighting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topology.checks.ports import rdma_less_port
from topology.facts import HostFacts, Link, TbPort


@dataclass(frozen=True)
class OneSided:
    """`host` port `port` lists `peer`'s bus on `peer_port`, but that port does not list it back."""

    host: str
    port: int
    peer: str
    peer_port: int


@dataclass(frozen=True)
class UnknownPeer:
    """A cable to a Mac that is not one of the hosts (its bus uuid is nobody's here)."""

    host: str
    port: int
    uuid: str


@dataclass(frozen=True)
class LinkGraph:
    names: tuple[str, ...]
    links: tuple[Link, ...]
    one_sided: tuple[OneSided, ...] = ()
    unknown_peers: tuple[UnknownPeer, ...] = ()
    duplicates: tuple[tuple[str, str], ...] = ()  # (host, the later host that is the same Mac)

    def between(self, a: str, b: str) -> tuple[Link, ...]:
        return tuple(k for k in self.links if {k.a, k.b} == {a, b})

    def connected(self, a: str, b: str, rdma: bool = False) -> bool:
        return any(k.rdma or not rdma for k in self.between(a, b))

    def used_ports(self, host: str) -> set[int]:
        return {k.port_of(host) for k in self.links if host in (k.a, k.b)}


def _duplicates(hosts: Sequence[HostFacts]) -> list[tuple[str, str]]:
    """Pairs of host entries that are the same Mac: a shared bus uuid or the same ssh target."""
    out = []
    for j, b in enumerate(hosts):
        for a in hosts[:j]:
            same_bus = {p.bus_uuid for p in a.tb_ports} & {p.bus_uuid for p in b.tb_ports}
            if same_bus or (a.ssh is not None and a.ssh == b.ssh):
                out.append((a.name, b.name))
                break
    return out


def _rdma(a: HostFacts, pa: TbPort, b: HostFacts, pb: TbPort) -> bool:
    """RDMA works on a cable when both ends have the port's rdma device and it is PORT_ACTIVE,
    and neither end is a port that lists a device yet does no RDMA (the Mac Studio's en2)."""
    if rdma_less_port(a, pa.iface) or rdma_less_port(b, pb.iface):
        return False
    da, db = a.rdma_device(pa.iface), b.rdma_device(pb.iface)
    return da is not None and db is not None and da.state == db.state == "active"


def _speed(pa: TbPort, pb: TbPort) -> float | None:
    speeds = [s for s in (pa.speed_gbps, pb.speed_gbps) if s is not None]
    return min(speeds) if speeds else None


def link_graph(hosts: Sequence[HostFacts]) -> LinkGraph:
    """Links from reciprocal bus uuids; one-sided sightings and cables to outsiders kept apart."""
    dups = _duplicates(hosts)
    skip = {b for _, b in dups}
    live = [h for h in hosts if h.name not in skip]
    where = {p.bus_uuid: (i, p) for i, h in enumerate(live) for p in h.tb_ports}
    links, one_sided, unknown = [], [], []
    for i, a in enumerate(live):
        for pa in a.tb_ports:
            if pa.peer_uuid is None:
                continue
            if pa.peer_uuid not in where:
                unknown.append(UnknownPeer(a.name, pa.port, pa.peer_uuid))
                continue
            j, pb = where[pa.peer_uuid]
            if j == i:
                continue  # a cable from a Mac back into itself carries nothing
            b = live[j]
            if pb.peer_uuid != pa.bus_uuid:
                one_sided.append(OneSided(a.name, pa.port, b.name, pb.port))
            elif j > i:  # reciprocal: record once, from the earlier host
                links.append(
                    Link(
                        a=a.name,
                        a_port=pa.port,
                        a_iface=pa.iface,
                        b=b.name,
                        b_port=pb.port,
                        b_iface=pb.iface,
                        speed_gbps=_speed(pa, pb),
                        rdma=_rdma(a, pa, b, pb),
                    )
                )
    return LinkGraph(
        names=tuple(h.name for h in hosts),
        links=tuple(links),
        one_sided=tuple(one_sided),
        unknown_peers=tuple(unknown),
        duplicates=tuple(dups),
    )


def free_ports(host: HostFacts) -> tuple[TbPort, ...]:
    """Ports with nothing plugged in (a dock or a one-sided cable is not free)."""
    return tuple(p for p in host.tb_ports if not p.connected and p.peer_uuid is None)


def is_full_mesh(graph: LinkGraph, names: Sequence[str], rdma: bool = False) -> bool:
    """Every pair of `names` joined by at least one cable (with RDMA working, if asked)."""
    return all(graph.connected(a, b, rdma) for i, a in enumerate(names) for b in names[i + 1 :])


SEARCH_BUDGET = 200_000  # steps; exact for N ≤ 9, best-found-so-far beyond (jaccl stops at 8)


def min_cost_cycle(
    names: Sequence[str], cost: dict[tuple[str, str], int]
) -> tuple[tuple[str, ...], int]:
    """The Hamiltonian cycle through all `names` with the least total pair cost (brute force).

    `cost[(a, b)]` (either order) is 0 for a ready pair; unlisted pairs cost 1. Starts at
    names[0], explores in list order and stops at the first zero-cost cycle, so it is deterministic.
    Each host still to visit adds at least its cheapest pair, which prunes hopeless paths early.
    """
    n = len(names)
    if n <= 2:
        total = _pair_cost(cost, names[0], names[1]) if n == 2 else 0
        return tuple(names), total
    cheapest = {a: min(_pair_cost(cost, a, b) for b in names if b != a) for a in names}
    best_ring: tuple[str, ...] = ()
    best_total = 1 << 30
    steps = 0
    path = [names[0]]
    left = set(names[1:])

    def walk(spent: int, bound: int) -> bool:
        nonlocal best_ring, best_total, steps
        steps += 1
        if spent + bound >= best_total or steps > SEARCH_BUDGET:
            return False
        if not left:
            total = spent + _pair_cost(cost, path[-1], path[0])
            if total < best_total:
                best_ring, best_total = tuple(path), total
            return total == 0
        for nxt in names:
            if nxt in left:
                left.discard(nxt)
                path.append(nxt)
                done = walk(spent + _pair_cost(cost, path[-2], nxt), bound - cheapest[nxt])
                path.pop()
                left.add(nxt)
                if done:
                    return True
        return False

    walk(0, sum(cheapest.values()))  # every host is entered once, the start by the closing pair
    return best_ring, best_total


def _pair_cost(cost: dict[tuple[str, str], int], a: str, b: str) -> int:
    return cost.get((a, b), cost.get((b, a), 1))


def find_ring(graph: LinkGraph, names: Sequence[str], rdma: bool = True) -> tuple[str, ...] | None:
    """A cycle through every host where each neighbour pair is cabled (with RDMA, if asked)."""
    if not names:
        return None
    cost = {
        (a, b): 0
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if graph.connected(a, b, rdma)
    }
    ring, total = min_cost_cycle(names, cost)
    return ring if total == 0 else None
