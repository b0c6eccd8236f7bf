"""Parsers for the raw outputs of the probed macOS commands: text in, values out.

One small function per command. Anything that does not look like that command's output raises
ParseError; `topology.host_facts` turns it into a ProbeGap: a bad file is a problem, not a crash.
The formats follow real captures (see tests/fixtures/captures/).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from topology.facts import IfaceAddr, PortState, RdmaDevice, RdmaState, Software, TbPort
from topology.untrusted import Refused, clean, parse_json

# XDomain protocol id of the RDMA service a Mac advertises once `rdma_ctl enable` is done.
RDMA_PROTOCOL_ID = 64087

# Every value is matched whole (fullmatch) and bounded: these outputs may come from anywhere
# (a snapshot someone sent, an agent on the network), and values end up in reports and fixes.
_SPEED_RE = re.compile(r"(\d{1,4}(?:\.\d{1,3})?)\s*Gb/s")
_TB_PORT_RE = re.compile(r"Thunderbolt (\d{1,3})")
_IFACE_RE = re.compile(r"([A-Za-z0-9_.-]{1,32}): flags=\d{1,10}<([^>]{0,400})>")
IFACE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")
_UUID_RE = re.compile(r"[0-9A-Za-z-]{1,64}")
_VERSION_RE = re.compile(r"\d{1,4}(?:\.\d{1,4}){0,3}")
_BUILD_RE = re.compile(r"[A-Za-z0-9]{1,32}")
_MODEL_RE = re.compile(r"[A-Za-z0-9,._ -]{1,64}")
_PACKAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_PACKAGE_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_!-]{0,63}")
MAX_PACKAGES = 64  # versions.txt lists python and three packages; leave room for more
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]{1,100}")
_TB_JSON_DEPTH = 64  # system_profiler nests daisy-chained devices; real output stays under 20
MAX_PORTS = 64  # Thunderbolt buses of one Mac (an M3 Ultra has 6)
MAX_MEMSIZE = 1 << 50  # 1 PiB: beyond any machine, yet every figure derived from it stays exact


class ParseError(ValueError):
    """The text is not the output this parser expects; the message says why in a few words."""


def _q(value: str) -> str:
    return repr(clean(value, 40))


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
    m = _SPEED_RE.fullmatch(str(tag.get("current_speed_key", "")).strip())
    return float(m.group(1)) if m and float(m.group(1)) > 0 else None


def _peer(items: Any) -> tuple[str | None, bool]:
    """The Mac at the other end of a cable: its bus uuid and whether it offers RDMA.

    Docks and drives are items too, but only another Mac carries a domain uuid.
    """
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("domain_uuid_key"), str):
            if not _UUID_RE.fullmatch(item["domain_uuid_key"]):
                raise ParseError(f"a peer's domain_uuid_key {_q(item['domain_uuid_key'])} is odd")
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
        data = parse_json(text, _TB_JSON_DEPTH)
    except Refused as e:
        raise ParseError(str(e)) from None
    buses = data.get("SPThunderboltDataType") if isinstance(data, dict) else None
    if not isinstance(buses, list):
        raise ParseError("no SPThunderboltDataType list")
    if len(buses) > MAX_PORTS:
        raise ParseError(f"{len(buses)} Thunderbolt buses (at most {MAX_PORTS} make sense)")
    ports = []
    for bus in buses:
        if not isinstance(bus, dict):
            raise ParseError("a Thunderbolt bus entry is not an object")
        tag = bus.get("receptacle_1_tag")
        uuid = bus.get("domain_uuid_key")
        if not isinstance(tag, dict) or not isinstance(uuid, str):
            continue  # not a Mac's own receptacle
        if not _UUID_RE.fullmatch(uuid):
            raise ParseError(f"domain_uuid_key {_q(uuid)} is not a bus uuid")
        port_id = str(tag.get("receptacle_id_key"))
        if not re.fullmatch(r"[0-9]{1,3}", port_id):
            raise ParseError(f"bus {uuid}: receptacle_id_key {_q(port_id)} is not a port number")
        port = int(port_id)
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
            device = line.partition(":")[2].strip()
            if IFACE_NAME.fullmatch(device):
                ports[name] = device
            elif _TB_PORT_RE.fullmatch(name):  # other ports do not matter; these name the cables
                raise ParseError(f"{_q(name)}: device {_q(device)} is not an interface name")
            name = None
    if not ports:
        raise ParseError("no `Hardware Port:` / `Device:` pairs")
    return ports


def thunderbolt_ifaces(hardware_ports: dict[str, str]) -> dict[int, str]:
    """Port number -> enX for every `Thunderbolt <n>` hardware port (the bridge is not one)."""
    out = {}
    for name, device in hardware_ports.items():
        m = _TB_PORT_RE.fullmatch(name)
        if m:
            out[int(m.group(1))] = device
    return out


def parse_ibv_devices(text: str) -> tuple[str, ...]:
    """`ibv_devices` -> device names; header only (no devices) while RDMA is disabled."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines or lines[0][0] != "device":
        raise ParseError("no `device  node GUID` header")
    names = tuple(words[0] for words in lines[1:] if not words[0].startswith("-"))
    for name in names:
        if not IFACE_NAME.fullmatch(name):
            raise ParseError(f"device {_q(name)} is not an RDMA device name")
    return names


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
            if not IFACE_NAME.fullmatch(value):
                raise ParseError(f"hca_id {_q(value)} is not an RDMA device name")
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
    raise ParseError(f"expected `enabled` or `disabled`, got {_q(text.strip())}")


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
    if not version or not _VERSION_RE.fullmatch(version):
        raise ParseError("no `ProductVersion:` line (like 26.2)")
    product = fields.get("ProductName", "")
    if product and not _PRINTABLE.fullmatch(product):
        raise ParseError(f"ProductName {_q(product)} is not a product name")
    build = fields.get("BuildVersion") or None
    return SwVers(product, version, build if build and _BUILD_RE.fullmatch(build) else None)


def parse_sysctl(text: str) -> Sysctl:
    """`sysctl hw.memsize hw.model machdep.cpu.brand_string` -> memory, model id, chip name."""
    fields = _colon_fields(text)
    if not {"hw.memsize", "hw.model", "machdep.cpu.brand_string"} & fields.keys():
        raise ParseError("none of hw.memsize, hw.model, machdep.cpu.brand_string")
    memsize = fields.get("hw.memsize")
    if memsize is not None and not re.fullmatch(r"[0-9]{1,20}", memsize):
        raise ParseError(f"hw.memsize is not a number: {_q(memsize)}")
    if memsize is not None and not 0 < int(memsize) <= MAX_MEMSIZE:
        raise ParseError(f"hw.memsize {memsize} is out of range (1 to {MAX_MEMSIZE} bytes)")
    model = fields.get("hw.model") or None
    if model is not None and not _MODEL_RE.fullmatch(model):
        raise ParseError(f"hw.model {_q(model)} is not a model identifier")
    chip = fields.get("machdep.cpu.brand_string") or None
    if chip is not None and not _PRINTABLE.fullmatch(chip):
        raise ParseError(f"machdep.cpu.brand_string {_q(chip)} is not a chip name")
    return Sysctl(memsize=int(memsize) if memsize is not None else None, model=model, chip=chip)


def _prefix(netmask: str) -> int:
    """`0xfffffffc` (macOS) or `255.255.255.252` (Linux) -> 30."""
    try:
        if not re.fullmatch(r"0x[0-9A-Fa-f]{1,8}|[0-9.]{7,15}", netmask):
            raise ValueError(netmask)
        value = (
            int(netmask, 16) if netmask.startswith("0x") else int(ipaddress.IPv4Address(netmask))
        )
    except ValueError:
        raise ParseError(f"bad netmask {_q(netmask)}") from None
    return bin(value & 0xFFFFFFFF).count("1")


def _ipv4(text: str) -> str:
    try:
        if not re.fullmatch(r"[0-9.]{7,15}", text):
            raise ValueError(text)
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise ParseError(f"inet {_q(text)} is not an IPv4 address") from None


def parse_ifconfig(text: str) -> Ifconfig:
    """`ifconfig` -> bridge0's members and state, and every IPv4 address with its prefix."""
    iface: str | None = None
    flags: dict[str, set[str]] = {}
    status: dict[str, str] = {}
    members: list[str] = []
    addrs: list[IfaceAddr] = []
    for line in text.splitlines():
        m = _IFACE_RE.match(line)  # a prefix of the line: the flags line goes on
        if m:
            iface = m.group(1)
            flags[iface] = set(m.group(2).split(","))
            continue
        words = line.split()
        if iface is None or not words:
            continue
        if words[0] == "member:" and iface == "bridge0" and len(words) > 1:
            if not IFACE_NAME.fullmatch(words[1]):
                raise ParseError(f"bridge0 member {_q(words[1])} is not an interface name")
            members.append(words[1])
        elif words[0] == "status:" and len(words) > 1:
            status[iface] = words[1]
        elif words[0] == "inet" and "netmask" in words[:-1]:
            mask = words[words.index("netmask") + 1]
            addrs.append(IfaceAddr(iface, _ipv4(words[1].removeprefix("addr:")), _prefix(mask)))
    if not flags:
        raise ParseError("no `<iface>: flags=` lines")
    bridge_up = "UP" in flags.get("bridge0", set())
    return Ifconfig(
        bridge_members=tuple(members),
        bridge_active=bridge_up and status.get("bridge0", "active") == "active",
        addrs=tuple(addrs),
    )


def parse_versions(text: str) -> Software:
    """versions.txt: `name version` per line (`-` = not installed), e.g. `mlx 0.32.2`."""
    found: dict[str, str | None] = {}
    for raw in text.splitlines():
        words = raw.split()
        if not words:
            continue
        if len(words) != 2 or not _PACKAGE_RE.fullmatch(words[0]):
            raise ParseError(f"{_q(raw.strip())} is not a `name version` line")
        name, version = words
        if version != "-" and not _PACKAGE_VERSION_RE.fullmatch(version):
            raise ParseError(f"{name}: {_q(version)} is not a version (or `-`)")
        if name in found:
            raise ParseError(f"{name} is listed twice")
        if len(found) >= MAX_PACKAGES:
            raise ParseError(f"more than {MAX_PACKAGES} lines")
        found[name] = None if version == "-" else version
    if not found:
        raise ParseError("no `name version` lines")
    return Software(tuple(found.items()))
