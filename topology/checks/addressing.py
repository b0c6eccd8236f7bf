"""IPv4 addresses on the Thunderbolt links in use: jaccl cannot connect without them.

jaccl needs an IPv4 address on both interfaces of every cable it uses ("RTR errno 22", mlx #3467),
and the two ends must share one subnet that no other interface of either Mac also claims (else
the kernel may send a peer's traffic out of another cable). Which cables are in use depends on the
backend: jaccl uses every cable (but those in an RDMA-less port), jaccl-ring and the TCP ring the
cables between ring neighbours. `topology setup` gives each cable that lacks a working pair a /30.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from topology.checks.ports import rdma_less_ends
from topology.facts import Backend, HostFacts, IfaceAddr, Link
from topology.finding import Finding
from topology.host_facts import IFCONFIG, NETWORKSETUP
from topology.links import LinkGraph, find_ring

AddressState = Literal["ok", "missing", "mismatch", "unknown"]
SETUP_FIX = (
    "Run `mlx-cluster topology setup` (it gives each cable its own /30 through networksetup), or "
    "set the addresses by hand in System Settings → Network → Thunderbolt N → Details → TCP/IP."
)


@dataclass(frozen=True)
class LinkAddresses:
    """A link's state and, when it works, the pair of addresses it has."""

    state: AddressState
    a: IfaceAddr | None = None
    b: IfaceAddr | None = None
    why: str = ""


def usable(ip: str) -> bool:
    """An address a peer can be reached at: IPv4, not loopback, not link-local."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return addr.version == 4 and not (addr.is_loopback or addr.is_link_local)


def network(a: IfaceAddr) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{a.ip}/{a.prefix}", strict=False)


def addressable(h: HostFacts) -> bool:
    """Its interfaces and addresses are known (networksetup and ifconfig were recorded)."""
    gaps = {g.file for g in h.gaps}
    return h.is_mac and IFCONFIG not in gaps and NETWORKSETUP not in gaps


def _clash(h: HostFacts, mine: IfaceAddr) -> IfaceAddr | None:
    """Another interface of `h` whose subnet overlaps this address's."""
    net = network(mine)
    return next(
        (o for o in h.addrs if o.iface != mine.iface and usable(o.ip) and network(o).overlaps(net)),
        None,
    )


def link_addresses(k: Link, hosts: dict[str, HostFacts]) -> LinkAddresses:
    """Whether both ends of `k` have addresses in one subnet of their own."""
    a, b = hosts.get(k.a), hosts.get(k.b)
    if a is None or b is None or not (addressable(a) and addressable(b)):
        return LinkAddresses("unknown")
    if k.a_iface is None or k.b_iface is None:
        return LinkAddresses("unknown")
    mine = [x for x in a.addrs_of(k.a_iface) if usable(x.ip)]
    theirs = [x for x in b.addrs_of(k.b_iface) if usable(x.ip)]
    if not mine or not theirs:
        return LinkAddresses("missing")
    shown = ", ".join(f"{x.ip}/{x.prefix}" for x in mine[:2])
    why = f"not in one subnet ({k.a} {k.a_iface} {shown}; "
    why += f"{k.b} {k.b_iface} {', '.join(f'{y.ip}/{y.prefix}' for y in theirs[:2])})"
    for x in mine:
        for y in theirs:
            if x.ip == y.ip or ipaddress.ip_address(y.ip) not in network(x):
                continue
            if ipaddress.ip_address(x.ip) not in network(y):
                continue
            clash = _clash(a, x) or _clash(b, y)
            if clash is None:
                return LinkAddresses("ok", x, y)
            owner = k.a if clash in a.addrs else k.b
            why = f"{network(x)} overlaps {owner}'s {clash.iface} ({clash.ip}/{clash.prefix})"
    return LinkAddresses("mismatch", why=why)


def ring_links(graph: LinkGraph, names: Sequence[str], rdma: bool) -> tuple[Link, ...]:
    """The cables between neighbours of the ring the planner picks (RDMA first when `rdma`)."""
    if len(names) < 2:
        return ()
    cabled = {n: {k.other(n) for k in graph.links if n in (k.a, k.b)} for n in names}
    if any(len(peers & set(names)) < min(2, len(names) - 1) for peers in cabled.values()):
        return ()  # someone has too few neighbours for any ring: skip the search
    ring = find_ring(graph, names, rdma=True) if rdma else None
    ring = ring or find_ring(graph, names, rdma=False)
    if not ring:
        return ()
    pairs = {frozenset((ring[i], ring[(i + 1) % len(ring)])) for i in range(len(ring))}
    return tuple(k for k in graph.links if frozenset((k.a, k.b)) in pairs)


@dataclass(frozen=True)
class LinkUse:
    """The links each backend uses: jaccl (mesh), jaccl-ring (RDMA ring), ring (TCP ring)."""

    jaccl: tuple[Link, ...]
    jaccl_ring: tuple[Link, ...]
    ring: tuple[Link, ...]

    def backends(self, k: Link) -> frozenset[Backend]:
        pairs: tuple[tuple[Backend, tuple[Link, ...]], ...] = (
            ("jaccl", self.jaccl),
            ("jaccl-ring", self.jaccl_ring),
            ("ring", self.ring),
        )
        return frozenset(b for b, links in pairs if k in links)

    def of(self, backend: str) -> tuple[Link, ...]:
        return {"jaccl": self.jaccl, "jaccl-ring": self.jaccl_ring}.get(backend, self.ring)


def link_use(hosts: Sequence[HostFacts], graph: LinkGraph) -> LinkUse:
    """Which cables each backend would use, the planner's way."""
    by_name = {h.name: h for h in hosts}
    good = tuple(k for k in graph.links if not rdma_less_ends(k, by_name))
    dups = {b for _, b in graph.duplicates}
    macs = [h.name for h in hosts if h.is_mac and h.name not in dups]
    everyone = [h.name for h in hosts if h.name not in dups]
    rdma_graph = LinkGraph(tuple(macs), good)
    return LinkUse(
        jaccl=good,
        jaccl_ring=ring_links(rdma_graph, macs, rdma=True),
        ring=ring_links(LinkGraph(tuple(everyone), graph.links), everyone, rdma=False),
    )


def _ends(k: Link) -> str:
    return f"{k.a} port {k.a_port} ({k.a_iface}) ↔ {k.b} port {k.b_port} ({k.b_iface})"


def address_findings(hosts: Sequence[HostFacts], graph: LinkGraph) -> list[Finding]:
    """link_no_address and link_address_mismatch for every cable some backend uses."""
    use = link_use(hosts, graph)
    by_name = {h.name: h for h in hosts}
    found = []
    for k in graph.links:
        backends = use.backends(k)
        if not backends:
            continue
        state = link_addresses(k, by_name)
        if state.state == "missing" and backends & {"jaccl", "jaccl-ring"}:
            # the TCP ring falls back to a LAN address: a bare cable only matters for RDMA
            bare = [
                f"{h} {i}"
                for h, i in ((k.a, k.a_iface), (k.b, k.b_iface))
                if i and not any(usable(x.ip) for x in by_name[h].addrs_of(i))
            ]
            message = (
                f"{_ends(k)}: {' and '.join(bare)} {'has' if len(bare) == 1 else 'have'} no IPv4 "
                "address; jaccl cannot connect over this cable (RTR errno 22, mlx #3467)"
            )
            blocks = backends & {"jaccl", "jaccl-ring"}
            found.append(Finding("link_no_address", (k.a, k.b), message, SETUP_FIX, blocks))
        elif state.state == "mismatch":
            message = f"{_ends(k)}: the two ends' addresses are {state.why}"
            found.append(Finding("link_address_mismatch", (k.a, k.b), message, SETUP_FIX, backends))
    return found
