"""Point-to-point /30 subnets for cables, from private ranges that overlap nothing in use.

A /30 holds exactly the two ends of one cable (.1 and .2), the way mlx.distributed_config
addresses cables. Every address any host already has is avoided, with its whole subnet, and so
is a /24 around every address a cluster file declares (`ips:` carries no netmask).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from ipaddress import IPv4Network

from topology.errors import InputError
from topology.facts import HostFacts

CABLE_PREFIX = 30
# Tried in order. 10.77.0.0/16 first: home and office LANs favour 192.168.x and 10.0.x, so a
# block in the middle of 10/8 rarely collides with a network the Macs are not on today.
POOLS = tuple(
    IPv4Network(n) for n in ("10.77.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
_DECLARED_PREFIX = 24


def taken_networks(hosts: Sequence[HostFacts]) -> list[IPv4Network]:
    """Every subnet some host has an address in (or declares one in)."""
    nets = [IPv4Network(f"{a.ip}/{a.prefix}", strict=False) for h in hosts for a in h.addrs]
    for h in hosts:
        for ip in h.ips:
            addr = ipaddress.ip_address(ip)
            if addr.version == 4:
                nets.append(IPv4Network(f"{ip}/{_DECLARED_PREFIX}", strict=False))
    return nets


class SubnetPool:
    """Hands out /30s that overlap no taken subnet and none handed out before."""

    def __init__(self, taken: Iterable[IPv4Network]) -> None:
        self.taken = sorted(set(taken), key=lambda n: (int(n.network_address), n.prefixlen))

    def _clash(self, candidate: IPv4Network) -> IPv4Network | None:
        return next((n for n in self.taken if n.overlaps(candidate)), None)

    def take(self) -> IPv4Network:
        size = 1 << (32 - CABLE_PREFIX)
        for pool in POOLS:
            at, end = int(pool.network_address), int(pool.broadcast_address) + 1
            while at + size <= end:
                candidate = IPv4Network((at, CABLE_PREFIX))
                clash = self._clash(candidate)
                if clash is None:
                    self.taken.append(candidate)
                    return candidate
                # skip past the whole clashing subnet, staying aligned to /30 boundaries
                past = int(clash.broadcast_address) + 1
                at = max(at + size, (past + size - 1) // size * size)
        raise InputError(
            "no free /30 left in 10/8, 172.16/12 or 192.168/16: the hosts' addresses cover them "
            "all; free a range, or address the Thunderbolt ports by hand"
        )
