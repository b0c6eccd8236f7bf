"""Parsers for the raw outputs of the probed macOS commands: text in, values out.

One small function per command. Anything that does not look like that command's output raises
ParseError; `topology.host_facts` turns it into a ProbeGap: a bad file is a problem, not a crash.
The formats follow real captures (see tests/fixtures/captures/).
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from topology.facts import IfaceAddr, PortState, RdmaDevice, RdmaState, TbPort

# XDomain protocol id of the RDMA service a Mac advertises once `rdma_ctl enable` is done.
RDMA_PROTOCOL_ID = 64087

_SPEED_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*Gb/s$")
_TB_PORT_RE = re.compile(r"^Thunderbolt (\d+)$")
_IFACE_RE = re.compile(r"^([A-Za-z0-9_.-]+): flags=\d+<([^>]*)>")


class ParseError(ValueError):
    """The text is not the output this parser expects; the message says why in a few words."""


@dataclass(frozen=True)
class SwVers:
    product: str  # "macOS"
    version: str  # "26.2"
    build: str | None


@dataclass(frozen=True)
class Sysctl:
    memsize: int | None
    model: str | None
    chip: str | None


@dataclass(frozen=True)
class Ifconfig:
    bridge_members: tuple[str, ...]
    bridge_active: bool
    addrs: tuple[IfaceAddr, ...]


def _speed(tag: dict[str, Any]) -> float | None:
    """`"80 Gb/s"` -> 80.0; `"Up to 120 Gb/s"` (nothing plugged in) and odd values -> None."""
    m = _SPEED_RE.match(str(tag.get("current_speed_key", "")).strip())
    return float(m.group(1)) if m else None


def _peer(items: Any) -> tuple[str | None, bool]:
    """The Mac at the other end of a cable: its bus uuid and whether it offers RDMA.

    Docks and drives are items too, but only another Mac carries a domain uuid.
    """
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("domain_uuid_key"), str):
            services = item.get("services_title")
            rdma = isinstance(services, list) and any(
                isinstance(s, dict) and s.get("protocol_id_key") == RDMA_PROTOCOL_ID
                for s in services
            )
            return item["domain_uuid_key"], rdma
    return None, False


def parse_thunderbolt(text: str) -> tuple[TbPort, ...]:
    """`system_profiler SPThunderboltDataType -json` -> one TbPort per bus (iface not yet known)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"not JSON ({e.msg} at line {e.lineno})") from None
    buses = data.get("SPThunderboltDataType") if isinstance(data, dict) else None
    if not isinstance(buses, list):
        raise ParseError("no SPThunderboltDataType list")
    ports = []
    for bus in buses:
        if not isinstance(bus, dict):
            raise ParseError("a Thunderbolt bus entry is not an object")
        tag = bus.get("receptacle_1_tag")
        uuid = bus.get("domain_uuid_key")
        if not isinstance(tag, dict) or not isinstance(uuid, str):
            continue  # not a Mac's own receptacle
        try:
            port = int(str(tag.get("receptacle_id_key")))
        except ValueError:
            raise ParseError(f"bus {uuid}: receptacle_id_key is not a number") from None
        connected = tag.get("receptacle_status_key") == "receptacle_connected"
        peer, rdma = _peer(bus.get("_items"))
        ports.append(
            TbPort(
                port=port,
                bus_uuid=uuid,
                connected=connected,
                speed_gbps=_speed(tag) if connected else None,
                peer_uuid=peer,
                peer_rdma_service=rdma,
            )
        )
    return tuple(sorted(ports, key=lambda p: p.port))


def parse_hardware_ports(text: str) -> dict[str, str]:
    """`networksetup -listallhardwareports` -> {"Thunderbolt 2": "en6", "Wi-Fi": "en0", ...}."""
    ports: dict[str, str] = {}
    name: str | None = None
    for line in text.splitlines():
        if line.startswith("Hardware Port:"):
            name = line.partition(":")[2].strip()
        elif line.startswith("Device:") and name is not None:
            ports[name] = line.partition(":")[2].strip()
            name = None
    if not ports:
        raise ParseError("no `Hardware Port:` / `Device:` pairs")
    return ports


def thunderbolt_ifaces(hardware_ports: dict[str, str]) -> dict[int, str]:
    """Port number -> enX for every `Thunderbolt <n>` hardware port (the bridge is not one)."""
    out = {}
    for name, device in hardware_ports.items():
        m = _TB_PORT_RE.match(name)
        if m:
            out[int(m.group(1))] = device
    return out


def parse_ibv_devices(text: str) -> tuple[str, ...]:
    """`ibv_devices` -> device names; header only (no devices) while RDMA is disabled."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines or lines[0][0] != "device":
        raise ParseError("no `device  node GUID` header")
    return tuple(words[0] for words in lines[1:] if not words[0].startswith("-"))


def _port_state(value: str) -> PortState:
    if value.startswith("PORT_ACTIVE"):
        return "active"
    if value.startswith("PORT_"):
        return "down"  # DOWN, INIT, ARMED: not usable yet
    return "unknown"


def parse_ibv_devinfo(text: str) -> tuple[RdmaDevice, ...]:
    """`ibv_devinfo` -> each hca_id and its port state (PORT_ACTIVE only if both ends have RDMA)."""
    devices: list[RdmaDevice] = []
    for raw in text.splitlines():
        key, _, value = raw.strip().partition(":")
        value = value.strip()
        if key == "hca_id":
            devices.append(RdmaDevice(value))
        elif key == "state" and devices:
            devices[-1] = RdmaDevice(devices[-1].name, _port_state(value))
    if not devices and text.strip() and "no ib devices" not in text.lower():
        raise ParseError("no `hca_id:` entries")
    return tuple(devices)


def parse_rdma_ctl(text: str) -> RdmaState:
    """`rdma_ctl status` prints `enabled` or `disabled`."""
    word = text.strip().lower()
    if word in ("enabled", "disabled"):
        return "enabled" if word == "enabled" else "disabled"
    raise ParseError(f"expected `enabled` or `disabled`, got {text.strip()[:40]!r}")


def _colon_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def parse_sw_vers(text: str) -> SwVers:
    """`sw_vers` -> product name, version, build."""
    fields = _colon_fields(text)
    version = fields.get("ProductVersion")
    if not version or not re.match(r"^\d+(\.\d+)*$", version):
        raise ParseError("no `ProductVersion:` line")
    return SwVers(fields.get("ProductName", ""), version, fields.get("BuildVersion") or None)


def parse_sysctl(text: str) -> Sysctl:
    """`sysctl hw.memsize hw.model machdep.cpu.brand_string` -> memory, model id, chip name."""
    fields = _colon_fields(text)
    if not {"hw.memsize", "hw.model", "machdep.cpu.brand_string"} & fields.keys():
        raise ParseError("none of hw.memsize, hw.model, machdep.cpu.brand_string")
    memsize = fields.get("hw.memsize")
    if memsize is not None and not memsize.isdigit():
        raise ParseError(f"hw.memsize is not a number: {memsize[:40]!r}")
    return Sysctl(
        memsize=int(memsize) if memsize is not None else None,
        model=fields.get("hw.model") or None,
        chip=fields.get("machdep.cpu.brand_string") or None,
    )


def _prefix(netmask: str) -> int:
    """`0xfffffffc` (macOS) or `255.255.255.252` (Linux) -> 30."""
    try:
        value = (
            int(netmask, 16) if netmask.startswith("0x") else int(ipaddress.IPv4Address(netmask))
        )
    except ValueError:
        raise ParseError(f"bad netmask {netmask!r}") from None
    return bin(value & 0xFFFFFFFF).count("1")


def parse_ifconfig(text: str) -> Ifconfig:
    """`ifconfig` -> bridge0's members and state, and every IPv4 address with its prefix."""
    iface: str | None = None
    flags: dict[str, set[str]] = {}
    status: dict[str, str] = {}
    members: list[str] = []
    addrs: list[IfaceAddr] = []
    for line in text.splitlines():
        m = _IFACE_RE.match(line)
        if m:
            iface = m.group(1)
            flags[iface] = set(m.group(2).split(","))
            continue
        words = line.split()
        if iface is None or not words:
            continue
        if words[0] == "member:" and iface == "bridge0" and len(words) > 1:
            members.append(words[1])
        elif words[0] == "status:" and len(words) > 1:
            status[iface] = words[1]
        elif words[0] == "inet" and "netmask" in words[:-1]:
            mask = words[words.index("netmask") + 1]
            addrs.append(IfaceAddr(iface, words[1].removeprefix("addr:"), _prefix(mask)))
    if not flags:
        raise ParseError("no `<iface>: flags=` lines")
    bridge_up = "UP" in flags.get("bridge0", set())
    return Ifconfig(
        bridge_members=tuple(members),
        bridge_active=bridge_up and status.get("bridge0", "active") == "active",
        addrs=tuple(addrs),
    )
