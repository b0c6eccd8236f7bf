"""Which IP address each rank is reached at, the way mlx.launch expects it.

ring (TCP): rank i listens on its address on the cable to its LEFT neighbour (rank i-1), as
mlx.distributed_config writes it; that is the /30 address ifconfig shows on that cable's enX. Off
Thunderbolt (a switch, Linux hosts) each host's address in the neighbour's subnet, else its first.
jaccl / jaccl-ring: the coordinator is rank 0's first ip, which every rank must reach, so a LAN
address (the cluster file's `ips:` first, else one not on a Thunderbolt port).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from topology.facts import HostFacts, Link

_GUESS_PREFIXES = (30, 29, 24)  # declared ips have no netmask: try a /30 cable first


def _usable(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return addr.version == 4 and not (addr.is_loopback or addr.is_link_local)


def _tb_ifaces(host: HostFacts) -> set[str]:
    return {p.iface for p in host.tb_ports if p.iface}


def lan_ip(host: HostFacts) -> str | None:
    """An address every other host can reach: declared ips first, else a non-Thunderbolt one."""
    if host.ips:
        return host.ips[0]
    tb = _tb_ifaces(host)
    candidates = [a for a in host.addrs if a.iface not in tb and _usable(a.ip)]
    candidates.sort(key=lambda a: (a.iface not in ("en0", "en1"), a.iface))
    return candidates[0].ip if candidates else None


def _cable_ip(host: HostFacts, left: HostFacts, links: Sequence[Link]) -> str | None:
    """host's address on a cable to `left` (the first cable that has one)."""
    between = sorted(
        (k for k in links if {k.a, k.b} == {host.name, left.name}),
        key=lambda k: (k.port_of(host.name), k.port_of(left.name)),
    )
    for k in between:
        iface = k.iface_of(host.name)
        if iface is None:
            continue
        for a in host.addrs_of(iface):
            if _usable(a.ip):  # 169.254/16 sits on every port: routing to it is ambiguous
                return a.ip
    return None


def _networks(host: HostFacts) -> list[tuple[str, list[ipaddress.IPv4Network]]]:
    """(ip, networks it may be in): ifconfig gives the prefix, declared ips get guesses."""
    out = [(a.ip, [ipaddress.IPv4Network(f"{a.ip}/{a.prefix}", strict=False)]) for a in host.addrs]
    out += [
        (ip, [ipaddress.IPv4Network(f"{ip}/{p}", strict=False) for p in _GUESS_PREFIXES])
        for ip in host.ips
    ]
    return [(ip, nets) for ip, nets in out if _usable(ip)]


def _subnet_ip(host: HostFacts, left: HostFacts) -> str | None:
    """host's address that shares the narrowest subnet with one of left's addresses."""
    theirs = [ipaddress.IPv4Address(ip) for ip, _ in _networks(left)]
    best: tuple[int, str] | None = None
    for ip, nets in _networks(host):
        for net in nets:
            if any(t in net and str(t) != ip for t in theirs):
                if best is None or net.prefixlen > best[0]:
                    best = (net.prefixlen, ip)
                break
    return best[1] if best else None


def ring_ip(host: HostFacts, left: HostFacts, links: Sequence[Link]) -> str | None:
    return _cable_ip(host, left, links) or _subnet_ip(host, left) or lan_ip(host)


def rank_addresses(
    hosts: Sequence[HostFacts], links: Sequence[Link], backend: str
) -> list[str | None]:
    """One address per rank (hosts in rank order); None where none is known."""
    n = len(hosts)
    if backend == "ring" and n > 1:
        return [ring_ip(h, hosts[(i - 1) % n], links) for i, h in enumerate(hosts)]
    return [lan_ip(h) for h in hosts]
