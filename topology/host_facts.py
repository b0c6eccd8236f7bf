"""One host's snapshot files -> HostFacts; a missing or unparsable file is a ProbeGap, not an error.

`files` maps a snapshot file name to its content (None when missing). Besides the eight command
outputs it may hold `uname.txt` (`uname -s`, recorded by the probe to tell a Mac from anything
else), the optional files (versions.txt, blas.txt, rates.json) and `<file>.error` (what went
wrong when the command failed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from topology.checks.blas import parse_blas
from topology.errors import one_line
from topology.facts import (
    BLAS_FILE,
    RATES_FILE,
    VERSIONS_FILE,
    HostFacts,
    ProbeGap,
    RdmaDevice,
    RdmaState,
    Software,
    TbPort,
)
from topology.host_rates import HostRates, parse_rates
from topology.parse import (
    Ifconfig,
    SwVers,
    Sysctl,
    parse_hardware_ports,
    parse_ibv_devices,
    parse_ibv_devinfo,
    parse_ifconfig,
    parse_rdma_ctl,
    parse_sw_vers,
    parse_sysctl,
    parse_thunderbolt,
    parse_versions,
    thunderbolt_ifaces,
)
from topology.untrusted import json_depth

UNAME_FILE = "uname.txt"
ERROR_SUFFIX = ".error"
SSH_FAILED = "ssh failed"  # how a probe error starts when ssh itself failed (host unreachable)

TB_JSON = "system_profiler_SPThunderboltDataType.json"
NETWORKSETUP = "networksetup_listallhardwareports.txt"
IBV_DEVICES = "ibv_devices.txt"
IBV_DEVINFO = "ibv_devinfo.txt"
RDMA_CTL = "rdma_ctl_status.txt"
SW_VERS = "sw_vers.txt"
SYSCTL = "sysctl.txt"
IFCONFIG = "ifconfig.txt"

# The command that produces each snapshot file (for messages and fixes; the probe runs these).
COMMANDS: dict[str, tuple[str, ...]] = {
    TB_JSON: ("system_profiler", "SPThunderboltDataType", "-json"),
    NETWORKSETUP: ("networksetup", "-listallhardwareports"),
    IBV_DEVICES: ("ibv_devices",),
    IBV_DEVINFO: ("ibv_devinfo",),
    RDMA_CTL: ("rdma_ctl", "status"),
    SW_VERS: ("sw_vers",),
    SYSCTL: ("sysctl", "hw.memsize", "hw.model", "machdep.cpu.brand_string"),
    IFCONFIG: ("ifconfig",),
}

T = TypeVar("T")
_GIB = 1 << 30


class _Reader:
    """Parses files one by one and remembers which ones were missing or unparsable."""

    def __init__(self, files: Mapping[str, str | None]) -> None:
        self.files = files
        self.gaps: list[ProbeGap] = []

    def read(self, file: str, parser: Callable[[str], T], needed: bool = True) -> T | None:
        text = self.files.get(file)
        if text is None:
            if needed:
                error = (self.files.get(file + ERROR_SUFFIX) or "").strip()
                # the .error note is text from elsewhere: one line, no terminal escapes
                first = one_line(error.splitlines()[0], 300) if error else "missing"
                self.gaps.append(ProbeGap(file, first))
            return None
        try:
            return parser(text)
        except ValueError as e:  # ParseError, or any value a parser found malformed
            self.gaps.append(ProbeGap(file, f"unparsable: {one_line(str(e), 200)}"))
            return None


def _software(r: _Reader) -> Software | None:
    """versions.txt when recorded; the python's own failure when it did not run; else None."""
    if r.files.get(VERSIONS_FILE) is not None:
        return r.read(VERSIONS_FILE, parse_versions)
    error = (r.files.get(VERSIONS_FILE + ERROR_SUFFIX) or "").strip()
    if not error or error.startswith(SSH_FAILED):
        return None  # not recorded (an older snapshot), or the host did not answer at all
    return Software((), one_line(error.splitlines()[0], 300))


def _rates(text: str) -> HostRates:
    json_depth(text)  # deep nesting refused (a ValueError) before json.loads recurses into it
    return parse_rates(text)


def _is_mac(files: Mapping[str, str | None], sw: SwVers | None) -> bool:
    """Darwin per `uname -s` if recorded, else judged by sw_vers (a missing file proves nothing)."""
    uname = (files.get(UNAME_FILE) or "").strip()
    if uname:
        return uname.split()[0] == "Darwin"
    if sw is not None:
        return "mac" in sw.product.lower() or sw.product == ""
    error = (files.get(SW_VERS + ERROR_SUFFIX) or "").lower()
    if error.startswith(SSH_FAILED):
        return True  # unreachable: nothing known, the probe_missing problem says so
    return not ("not found" in error or "exit 127" in error)


def _ports(tb: tuple[TbPort, ...], ifaces: dict[int, str]) -> tuple[TbPort, ...]:
    """Attach enX to each port through networksetup's `Thunderbolt <n>` (never by number)."""
    return tuple(replace(p, iface=ifaces.get(p.port)) for p in tb)


def _rdma_state(ctl: RdmaState | None, names: tuple[str, ...] | None) -> RdmaState:
    if ctl is not None:
        return ctl
    if names is None:
        return "unknown"
    # Without rdma_ctl: devices exist only while RDMA is enabled (header only otherwise).
    return "enabled" if names else "disabled"


def _devices(
    names: tuple[str, ...] | None, info: tuple[RdmaDevice, ...] | None
) -> tuple[RdmaDevice, ...]:
    states = {d.name: d.state for d in info or ()}
    if names is None:
        return tuple(info or ())
    return tuple(RdmaDevice(n, states.get(n, "unknown")) for n in names)


def _host_settings(host_yaml: Mapping[str, Any] | None) -> dict[str, Any]:
    raw = host_yaml or {}
    wired = raw.get("wired_limit_gb")
    return {
        "ssh": raw.get("ssh"),
        "ips": tuple(raw.get("ips") or ()),
        "wired_limit_bytes": int(wired * _GIB) if wired else None,
        "bandwidth_gbs": raw.get("bandwidth_gbs"),
    }


def host_facts(
    name: str, files: Mapping[str, str | None], host_yaml: Mapping[str, Any] | None = None
) -> HostFacts:
    """Everything the checks need about one host, from its snapshot files."""
    r = _Reader(files)
    sw = r.read(SW_VERS, parse_sw_vers)
    is_mac = _is_mac(files, sw)
    tb = r.read(TB_JSON, parse_thunderbolt)
    hw_ports = r.read(NETWORKSETUP, parse_hardware_ports)
    names = r.read(IBV_DEVICES, parse_ibv_devices)
    info = r.read(IBV_DEVINFO, parse_ibv_devinfo, needed=bool(names))
    ctl = r.read(RDMA_CTL, parse_rdma_ctl)
    sysctl: Sysctl = r.read(SYSCTL, parse_sysctl) or Sysctl(None, None, None)
    ifc: Ifconfig = r.read(IFCONFIG, parse_ifconfig) or Ifconfig((), False, ())
    ifaces = thunderbolt_ifaces(hw_ports) if hw_ports else {}
    return HostFacts(
        name=name,
        **_host_settings(host_yaml),
        chip=sysctl.chip,
        hw_model=sysctl.model,
        memory_bytes=sysctl.memsize,
        macos=sw.version if sw and is_mac else None,
        macos_build=sw.build if sw and is_mac else None,
        is_mac=is_mac,
        rdma=_rdma_state(ctl, names) if is_mac else "unknown",
        rdma_devices=_devices(names, info),
        tb_ports=_ports(tb or (), ifaces),
        bridge_members=ifc.bridge_members,
        bridge_active=ifc.bridge_active,
        addrs=ifc.addrs,
        software=_software(r),
        blas=None if is_mac else r.read(BLAS_FILE, parse_blas, needed=False),
        # Not recorded, or the microbenchmark failed: the chip table stands in (no problem).
        rates=r.read(RATES_FILE, _rates, needed=False),
        gaps=tuple(r.gaps),
    )


def thunderbolt_iface_set(host: HostFacts) -> set[str]:
    """The host's Thunderbolt interfaces (enX of every port networksetup named)."""
    return {p.iface for p in host.tb_ports if p.iface is not None}
