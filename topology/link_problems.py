"""Cabling problems between Macs: missing, one-sided, RDMA-down, RDMA-less and slow cables.

A missing cable blocks jaccl (full mesh) always, and jaccl-ring only when no RDMA ring exists and
the pair sits on the cheapest ring to complete. Free ports are handed out once each, ring pairs
first, so every `fix` names a cable a person can plug in (or a port to move one to) right now;
the Mac Studio's RDMA-less port is never handed out.
"""

from __future__ import annotations

from collections.abc import Sequence

from topology.checks.ports import rdma_less_ends, rdma_ports
from topology.facts import Backend, HostFacts, Link, TbPort
from topology.finding import NO_BACKEND, Finding
from topology.links import LinkGraph, free_ports, min_cost_cycle

FAST_LINK_GBPS = 80.0  # Thunderbolt 5; 40 Gb/s means a TB4/USB4 cable or port somewhere


def _port(p: TbPort) -> str:
    return f"port {p.port} ({p.iface})" if p.iface else f"port {p.port}"


def _end(host: str, port: int, iface: str | None) -> str:
    return f"{host} port {port}" + (f" ({iface})" if iface else "")


def _rdma_ready(h: HostFacts) -> bool:
    return h.rdma == "enabled" and bool(h.rdma_devices)


class _Ports:
    """Free ports per host, each handed out to one missing cable only."""

    def __init__(self, hosts: Sequence[HostFacts]) -> None:
        self.free = {h.name: list(rdma_ports(h, free_ports(h))) for h in hosts}
        self.total = {h.name: len(rdma_ports(h, h.tb_ports)) for h in hosts}

    def take(self, host: str) -> TbPort | None:
        return self.free[host].pop(0) if self.free[host] else None

    def take_pair(self, a: str, b: str) -> tuple[TbPort, TbPort] | str:
        """A free port on each end, or the name of the end that has none (nothing taken then)."""
        for host in (a, b):
            if not self.free[host]:
                return host
        return self.free[a].pop(0), self.free[b].pop(0)


def _missing(a: str, b: str, ports: _Ports, n_macs: int, blocks: frozenset[Backend]) -> Finding:
    on_ring = "jaccl-ring" in blocks
    why = "jaccl needs every pair cabled"
    if on_ring:
        why += "; this cable is also the shortest way to close a ring for jaccl-ring"
    message = f"{a} and {b} are not cabled together ({why})"
    pair = ports.take_pair(a, b)
    if not isinstance(pair, str):
        fix = f"Connect a Thunderbolt 5 cable from {a} {_port(pair[0])} to {b} {_port(pair[1])}."
    else:
        other = b if pair == a else a
        fix = (
            f"{pair} has no free Thunderbolt port with RDMA ({ports.total[pair]} such ports, "
            "all in use)"
        )
        if not on_ring:
            fix += (
                f" and a full mesh of {n_macs} Macs needs {n_macs - 1} on each: use "
                "`--backend jaccl-ring` (a ring needs 2 ports per Mac), or"
            )
        fix += f" unplug something from {pair} and cable that port to {other}."
    return Finding("missing_link", (a, b), message, fix, blocks)


def _one_sided(graph: LinkGraph, a: str, b: str, blocks: frozenset[Backend]) -> Finding:
    s = next(s for s in graph.one_sided if {s.host, s.peer} == {a, b})
    message = (
        f"{s.host} port {s.port} sees {s.peer} (its port {s.peer_port}) but {s.peer} port "
        f"{s.peer_port} does not see {s.host}: the cable is recognised at one end only"
    )
    fix = (
        f"Unplug and replug the cable between {s.host} port {s.port} and {s.peer} port "
        f"{s.peer_port} (a Thunderbolt cable, not a charge-only USB-C one), then take a new "
        f"snapshot; if it persists, reboot {s.peer}."
    )
    return Finding("asymmetric_link", (a, b), message, fix, blocks)


def _port_down(k: Link, hosts: dict[str, HostFacts], blocks: frozenset[Backend]) -> Finding:
    ends = f"{_end(k.a, k.a_port, k.a_iface)} ↔ {_end(k.b, k.b_port, k.b_iface)}"
    states = []
    for host, iface in ((k.a, k.a_iface), (k.b, k.b_iface)):
        dev = hosts[host].rdma_device(iface)
        states.append(f"{host} rdma_{iface}: {dev.state}" if dev else f"{host}: no rdma_{iface}")
    message = f"{ends}: RDMA is not active although both Macs have it enabled ({'; '.join(states)})"
    fix = (
        f"Reseat the Thunderbolt 5 cable between {k.a} port {k.a_port} and {k.b} port {k.b_port}; "
        f"if `ibv_devinfo` still shows PORT_DOWN, reboot {k.a} and {k.b}."
    )
    return Finding("rdma_port_down", (k.a, k.b), message, fix, blocks)


def _rdma_less(
    k: Link, ends: tuple[str, ...], ports: _Ports, blocks: frozenset[Backend]
) -> Finding:
    cable = f"{_end(k.a, k.a_port, k.a_iface)} ↔ {_end(k.b, k.b_port, k.b_iface)}"
    which = " and ".join(f"{h}'s {k.iface_of(h)}" for h in ends)
    message = (
        f"{cable}: {which} is the Mac Studio port next to the Ethernet port, which does no RDMA"
    )
    if not blocks:
        message += " (another cable joins the pair, so nothing depends on this one)"
    moves = []
    for h in ends:
        port = ports.take(h)
        here = _end(h, k.port_of(h), k.iface_of(h))
        moves.append(
            f"Move the cable from {here} to {h} {_port(port)}."
            if port is not None
            else f"Free a port on {h} (it has no other free Thunderbolt port) and move the cable "
            f"from {here} there."
        )
    fix = " ".join(moves) + " Any port but the one next to Ethernet does RDMA."
    return Finding("rdma_port_unsupported", ends, message, fix, blocks)


def _slow(k: Link) -> Finding:
    ends = f"{_end(k.a, k.a_port, k.a_iface)} ↔ {_end(k.b, k.b_port, k.b_iface)}"
    message = f"{ends} runs at {k.speed_gbps:g} Gb/s (Thunderbolt 5 gives 80 Gb/s)"
    fix = (
        f"Replace the cable between {k.a} port {k.a_port} and {k.b} port {k.b_port} with a "
        f"Thunderbolt 5 cable; {k.speed_gbps:g} Gb/s means a TB4/USB4 cable or port."
    )
    return Finding("slow_link", (k.a, k.b), message, fix, NO_BACKEND)


def _ring_pairs(graph: LinkGraph, names: Sequence[str]) -> set[frozenset[str]]:
    """Neighbour pairs of the cheapest ring to finish; empty when an RDMA ring already exists."""
    cost = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            cost[(a, b)] = (
                0 if graph.connected(a, b, rdma=True) else 1 if graph.between(a, b) else 2
            )
    ring, total = min_cost_cycle(names, cost)
    if total == 0 or len(ring) < 2:
        return set()
    pairs = {frozenset((ring[i], ring[(i + 1) % len(ring)])) for i in range(len(ring))}
    return {p for p in pairs if not graph.connected(min(p), max(p), rdma=True)}


def link_findings(macs: Sequence[HostFacts], graph: LinkGraph, all_known: bool) -> list[Finding]:
    """Findings for every pair of `macs` (Macs with Thunderbolt data), in host order.

    `all_known`: every host's Thunderbolt data is here, so an unknown bus uuid is a real outsider.
    """
    names = [h.name for h in macs]
    by_name = {h.name: h for h in macs}
    ring = _ring_pairs(graph, names) if len(names) >= 2 else set()
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    pairs.sort(key=lambda p: frozenset(p) not in ring)  # ring cables get free ports first
    ports = _Ports(macs)
    found: list[Finding] = []
    for a, b in pairs:
        blocks: frozenset[Backend] = frozenset(
            ["jaccl", "jaccl-ring"] if frozenset((a, b)) in ring else ["jaccl"]
        )
        every = graph.between(a, b)
        links = tuple(k for k in every if not rdma_less_ends(k, by_name))
        for k in every:  # a cable in the RDMA-less port matters when no other joins the pair
            if ends := rdma_less_ends(k, by_name):
                found.append(_rdma_less(k, ends, ports, NO_BACKEND if links else blocks))
        if not every and any({s.host, s.peer} == {a, b} for s in graph.one_sided):
            found.append(_one_sided(graph, a, b, blocks))
        elif not every:
            found.append(_missing(a, b, ports, len(names), blocks))
        elif links and not any(k.rdma for k in links):
            if all(_rdma_ready(by_name[h]) for h in (a, b)):
                found.extend(_port_down(k, by_name, blocks) for k in links)
        elif links:
            found.extend(_port_down(k, by_name, NO_BACKEND) for k in links if not k.rdma)
    for k in graph.links:
        if k.speed_gbps is not None and k.speed_gbps < FAST_LINK_GBPS:
            found.append(_slow(k))
    if all_known:
        for u in graph.unknown_peers:
            found.append(
                Finding(
                    "unknown_peer",
                    (u.host,),
                    f"{u.host} port {u.port} is cabled to a Mac that is not in this cluster",
                    f"Add that Mac to the cluster, or unplug the cable from {u.host} port {u.port} "
                    "to free the port.",
                    NO_BACKEND,
                )
            )
    return found
