"""The wiring part of the dashboard: every host and cable of a CheckResult, and the problems
`topology check` found with their fixes, as the page draws them. The same function feeds
`serve`'s /v1/cluster/state and `topology check --html`, so there is one wiring view.

Nothing that says how to reach a host goes out (its ssh destination, ssh options): only what
the host is and how it is cabled.
"""

from __future__ import annotations

from typing import Any

from topology.facts import CheckResult, HostFacts, Link

SOFTWARE = ("python", "mlx", "mlx-lm", "mlx-cluster")


def host_json(h: HostFacts) -> dict[str, Any]:
    versions = {n: h.software.version(n) for n in SOFTWARE} if h.software else {}
    return {
        "name": h.name,
        "chip": h.chip,
        "model": h.hw_model,
        "memory_bytes": h.memory_bytes,
        "macos": h.macos,
        "macos_build": h.macos_build,
        "is_mac": h.is_mac,
        "rdma": h.rdma,
        "versions": versions,
        "blas": h.blas,
        "ports": [
            {"port": p.port, "iface": p.iface, "connected": p.connected, "speed_gbps": p.speed_gbps}
            for p in h.tb_ports
        ],
    }


def _addresses(h: HostFacts | None, iface: str | None) -> list[str]:
    if h is None or iface is None:
        return []
    return [f"{a.ip}/{a.prefix}" for a in h.addrs_of(iface)]


def link_json(k: Link, by_name: dict[str, HostFacts]) -> dict[str, Any]:
    return {
        "a": k.a,
        "a_port": k.a_port,
        "a_iface": k.a_iface,
        "a_addresses": _addresses(by_name.get(k.a), k.a_iface),
        "b": k.b,
        "b_port": k.b_port,
        "b_iface": k.b_iface,
        "b_addresses": _addresses(by_name.get(k.b), k.b_iface),
        "speed_gbps": k.speed_gbps,
        "rdma": k.rdma,
    }


def wiring_json(result: CheckResult) -> dict[str, Any]:
    """`hosts`, `links`, `problems` and the backend the wiring supports (`check`)."""
    by_name = {h.name: h for h in result.hosts}
    return {
        "hosts": [host_json(h) for h in result.hosts],
        "links": [link_json(k, by_name) for k in result.links],
        "problems": [p.to_json() for p in result.problems],
        "check": {"ok": result.ok, "target": result.target, "backend": result.backend},
    }
