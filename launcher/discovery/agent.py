"""`mlx-cluster agent`: advertise this host on mDNS and serve its probe snapshot read-only.

The agent probes once at start; what it serves and advertises never changes while it runs, and
no request makes it run anything. Stopping it unregisters the service (mDNS goodbye packets), so
browsers drop it at once; a crashed agent disappears when its records' TTL runs out.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import ifaddr
from zeroconf import IPVersion, NonUniqueNameException, ServiceInfo, Zeroconf

from launcher.discovery.http import SnapshotServer
from launcher.discovery.txt import SERVICE_TYPE, AgentFacts, agent_facts, encode_txt
from launcher.hosts.snapshots import read_host_files
from topology.errors import InputError
from topology.facts import HostFacts

DEFAULT_TTL_S = 120  # RFC 6762's TTL for host records
_ROUTE_PROBE = "198.51.100.1"  # TEST-NET-2: only used to ask the kernel for the default route


def agent_version() -> str:
    try:
        return version("mlx-cluster")
    except PackageNotFoundError:
        return "unknown"


def _primary_address() -> str | None:
    """The source address of the default route (UDP connect sends no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((_ROUTE_PROBE, 9))
        except OSError:
            return None
        return str(s.getsockname()[0])


def ipv4_addresses(interface: str | None) -> tuple[str, ...]:
    """IPv4 addresses to serve on: the interface's, else all non-loopback (default route first)."""
    adapters = ifaddr.get_adapters()
    if interface is not None:
        match = [a for a in adapters if interface in (a.name, a.nice_name)]
        if not match:
            names = ", ".join(sorted(str(a.name) for a in adapters))
            raise InputError(f"--interface {interface}: no such interface (this host has: {names})")
        found = tuple(str(ip.ip) for a in match for ip in a.ips if ip.is_IPv4)
        if not found:
            raise InputError(f"--interface {interface}: has no IPv4 address; give it one first")
        return found
    found = tuple(
        str(ip.ip)
        for a in adapters
        for ip in a.ips
        if ip.is_IPv4 and not ipaddress.ip_address(str(ip.ip)).is_loopback
    )
    if not found:
        raise InputError("no IPv4 address on any interface: connect a network or pass --interface")
    primary = _primary_address()
    return tuple(sorted(found, key=lambda a: a != primary))


def read_host_snapshot(directory: Path) -> dict[str, str | None]:
    """A recorded host snapshot (one host's directory) to serve instead of probing this host."""
    if not directory.is_dir():
        raise InputError(f"--snapshot {directory}: not a directory (give one host's snapshot dir)")
    files = read_host_files(directory)
    if all(v is None for v in files.values()):
        raise InputError(f"--snapshot {directory}: holds no snapshot files; give one host's dir")
    return files


def default_ssh(addresses: tuple[str, ...]) -> str:
    """Prefer a routable address over a self-assigned (169.254/16) one."""
    routable = [a for a in addresses if not ipaddress.ip_address(a).is_link_local]
    return (routable or list(addresses))[0]


def service_info(facts: AgentFacts, addresses: tuple[str, ...], port: int, ttl: int) -> ServiceInfo:
    return ServiceInfo(
        SERVICE_TYPE,
        f"{facts.name}.{SERVICE_TYPE}",
        port=port,
        properties=encode_txt(facts),
        # The agent's own host name, so it never competes with the OS's `<hostname>.local`.
        server=f"{facts.name}-mlx-agent.local.",
        host_ttl=ttl,
        other_ttl=ttl,
        parsed_addresses=list(addresses),
    )


class Agent:
    """HTTP servers + the mDNS registration; `start()` then `close()` (or use `with`)."""

    def __init__(
        self,
        facts: HostFacts,
        snapshot: Mapping[str, str | None],
        addresses: tuple[str, ...],
        port: int = 0,
        ttl: int = DEFAULT_TTL_S,
        ssh: str | None = None,
    ) -> None:
        self.addresses = addresses
        self.advertised = agent_facts(facts, ssh or default_ssh(addresses), agent_version())
        self._ttl = ttl
        self._http = SnapshotServer(
            addresses,
            port,
            snapshot,
            {"agent": self._about(), "host": asdict(facts)},
            f"mlx-cluster-agent/{self.advertised.version}",
        )
        self.port = self._http.port
        self._zc: Zeroconf | None = None
        self._info: ServiceInfo | None = None

    def _about(self) -> dict[str, object]:
        a = self.advertised
        return {"name": a.name, "ssh": a.ssh, "version": a.version, **a.to_json()}

    def start(self) -> None:
        self._http.start()
        try:
            self._zc, self._info = self._register()
        except BaseException:
            self._http.close()
            raise

    def _register(self) -> tuple[Zeroconf, ServiceInfo]:
        info = service_info(self.advertised, self.addresses, self.port, self._ttl)
        try:
            zc = Zeroconf(interfaces=list(self.addresses), ip_version=IPVersion.V4Only)
        except (OSError, RuntimeError) as e:
            raise InputError(f"cannot use mDNS on {', '.join(self.addresses)} ({e})") from None
        try:
            zc.register_service(info)
        except NonUniqueNameException:
            zc.close()
            raise InputError(
                f"another agent already advertises the name {self.advertised.name!r} on this "
                "network; stop it or pass --name"
            ) from None
        except BaseException:
            zc.close()
            raise
        return zc, info

    def close(self) -> None:
        if self._zc is not None and self._info is not None:
            self._zc.unregister_service(self._info)  # goodbye packets: browsers drop us now
            self._zc.close()
            self._zc = self._info = None
        self._http.close()

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
