"""Thunderbolt ports that exist but carry no RDMA: the Mac Studio's port next to Ethernet.

On a Mac Studio that Thunderbolt 5 port does not do RDMA (exo README); exo PR #1551 recognises
it as the port whose interface is en2 on a Mac Studio. `ibv_devices` still lists rdma_en2, so
nothing in the probe outputs says so: the model identifier does.
"""

from __future__ import annotations

from topology.facts import HostFacts, Link, TbPort

# Mac Studio model identifiers (Apple, "Identify your Mac Studio model"): M1 Max/Ultra 2022,
# M2 Max/Ultra 2023, M4 Max and M3 Ultra 2025.
MAC_STUDIO_MODELS = frozenset({"Mac13,1", "Mac13,2", "Mac14,13", "Mac14,14", "Mac16,9", "Mac15,14"})
RDMA_LESS_IFACE = "en2"


def is_mac_studio(host: HostFacts) -> bool:
    return host.hw_model in MAC_STUDIO_MODELS


def rdma_less_port(host: HostFacts, iface: str | None) -> bool:
    """The interface is the Mac Studio port that does no RDMA."""
    return iface == RDMA_LESS_IFACE and is_mac_studio(host)


def rdma_less_ends(link: Link, hosts: dict[str, HostFacts]) -> tuple[str, ...]:
    """The hosts whose end of `link` sits in an RDMA-less port (none, one or both)."""
    return tuple(
        h
        for h, iface in ((link.a, link.a_iface), (link.b, link.b_iface))
        if h in hosts and rdma_less_port(hosts[h], iface)
    )


def rdma_ports(host: HostFacts, ports: tuple[TbPort, ...]) -> tuple[TbPort, ...]:
    """`ports` without the RDMA-less one: where an RDMA cable may go."""
    return tuple(p for p in ports if not rdma_less_port(host, p.iface))
