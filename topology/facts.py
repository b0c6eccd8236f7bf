"""Frozen facts the rest of the project passes around: hosts, links, problems.

Everything here is plain data; parsing lives in `topology.parse`, the link graph in
`topology.links`, validation in `topology.problems`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from topology.host_rates import HostRates

RdmaState = Literal["enabled", "disabled", "unknown"]
PortState = Literal["active", "down", "unknown"]
Severity = Literal["error", "warning"]
Backend = Literal["jaccl", "jaccl-ring", "ring"]

# Files of one host's snapshot, named as the snapshot contract says.
SNAPSHOT_FILES = (
    "system_profiler_SPThunderboltDataType.json",
    "networksetup_listallhardwareports.txt",
    "ibv_devices.txt",
    "ibv_devinfo.txt",
    "rdma_ctl_status.txt",
    "sw_vers.txt",
    "sysctl.txt",
    "ifconfig.txt",
)
# Optional files: a snapshot without them is complete (they add checks, never a probe_missing).
VERSIONS_FILE = "versions.txt"  # `name version` per line, from the host's configured python
BLAS_FILE = "blas.txt"  # Linux hosts: the BLAS a rank would use (topology/checks/blas.py)
RATES_FILE = "rates.json"  # measured rates (`python -m cluster.microbench`, topology/host_rates.py)
OPTIONAL_SNAPSHOT_FILES = (VERSIONS_FILE, BLAS_FILE, RATES_FILE)


@dataclass(frozen=True)
class TbPort:
    """One physical Thunderbolt receptacle of a Mac (one Thunderbolt bus)."""

    port: int  # receptacle id, as printed on "Hardware Port: Thunderbolt <port>"
    bus_uuid: str  # this bus's domain uuid; the Mac at the other end lists it as its peer
    connected: bool
    speed_gbps: float | None  # current link speed; None when nothing is plugged in
    peer_uuid: str | None = None  # the other Mac's bus uuid, when a Mac is at the other end
    peer_rdma_service: bool = False  # the other Mac advertises the RDMA XDomain service
    iface: str | None = None  # enX, from networksetup (never guessed from the port number)


@dataclass(frozen=True)
class RdmaDevice:
    name: str  # rdma_enX
    state: PortState = "unknown"


@dataclass(frozen=True)
class IfaceAddr:
    iface: str
    ip: str
    prefix: int  # netmask as a prefix length (0xfffffffc -> 30)


@dataclass(frozen=True)
class ProbeGap:
    """A snapshot file that was missing or could not be parsed."""

    file: str
    reason: str


@dataclass(frozen=True)
class Software:
    """What the host's configured python has: `python`, `mlx`, `mlx-lm`, `mlx-cluster`, ...

    `versions` pairs a name with its version, None when the package is not installed.
    """

    versions: tuple[tuple[str, str | None], ...]
    error: str | None = None  # the configured python did not run (its first error line)

    def version(self, name: str) -> str | None:
        return dict(self.versions).get(name)

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.versions)


@dataclass(frozen=True)
class HostFacts:
    name: str
    ssh: str | None = None
    ips: tuple[str, ...] = ()
    chip: str | None = None  # "Apple M3 Ultra"
    hw_model: str | None = None  # "Mac15,14"
    memory_bytes: int | None = None
    macos: str | None = None  # "26.2"
    macos_build: str | None = None
    is_mac: bool = True
    rdma: RdmaState = "unknown"
    rdma_devices: tuple[RdmaDevice, ...] = ()
    tb_ports: tuple[TbPort, ...] = ()
    bridge_members: tuple[str, ...] = ()  # interfaces inside bridge0
    bridge_active: bool = False
    addrs: tuple[IfaceAddr, ...] = ()
    gaps: tuple[ProbeGap, ...] = ()
    wired_limit_bytes: int | None = None  # GPU-usable memory when the user set it
    bandwidth_gbs: float | None = None  # memory bandwidth override (GB/s)
    software: Software | None = None  # None: versions.txt not recorded (nothing to compare)
    blas: str | None = None  # blas.txt of a host that is not a Mac: "openblas PATH", "reference"
    rates: HostRates | None = None  # rates.json: measured bandwidth and matmul throughput

    def rdma_device(self, iface: str | None) -> RdmaDevice | None:
        if iface is None:
            return None
        return next((d for d in self.rdma_devices if d.name == f"rdma_{iface}"), None)

    def addrs_of(self, iface: str) -> tuple[IfaceAddr, ...]:
        return tuple(a for a in self.addrs if a.iface == iface)


@dataclass(frozen=True)
class Link:
    """One cable between two Macs, recognised by reciprocal bus uuids."""

    a: str
    a_port: int
    a_iface: str | None
    b: str
    b_port: int
    b_iface: str | None
    speed_gbps: float | None
    rdma: bool  # RDMA usable on this cable: devices on both ends, port active

    def other(self, host: str) -> str:
        return self.b if host == self.a else self.a

    def iface_of(self, host: str) -> str | None:
        return self.a_iface if host == self.a else self.b_iface

    def port_of(self, host: str) -> int:
        return self.a_port if host == self.a else self.b_port


@dataclass(frozen=True)
class Problem:
    code: str
    severity: Severity
    hosts: tuple[str, ...]
    message: str
    fix: str

    def to_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "severity": self.severity,
            "hosts": list(self.hosts),
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class CheckResult:
    """What `topology check` says: the best backend today and what blocks the target."""

    target: str  # the backend asked for ("auto" means jaccl)
    backend: Backend | None  # best backend this wiring supports now
    hosts: tuple[HostFacts, ...]
    links: tuple[Link, ...]
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)
