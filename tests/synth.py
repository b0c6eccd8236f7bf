"""Synthesize N-host snapshots as the raw text real Macs print (formats from real captures).

Build a `Cluster` of `SynthHost`s, plug `cable`s between ports, then take `files()` (what the probe
would have recorded, per host), `write(dir)` a snapshot, or `facts()`. Each host maps its ports to
interfaces non-monotonically (and differently per host), like real Macs (1→en1, 2→en6, 3→en2), so
code that guesses an interface from a port number fails the tests. On a Mac Studio the port whose
interface is en2 does no RDMA: `cable()` never picks it unless a port is given.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from topology.facts import HostFacts
from topology.host_facts import host_facts


@dataclass(frozen=True)
class Preset:
    chip: str
    hw_model: str
    device_name: str
    ports: int
    tb5: bool  # Thunderbolt 5, RDMA capable; False = TB4-class: enabled but no rdma devices
    memory_gb: int

    @property
    def studio(self) -> bool:
        return self.device_name == "Mac Studio"


# Port counts are the rear/front Thunderbolt ports of each model (Apple tech specs).
PRESETS = {
    "m3-ultra": Preset("Apple M3 Ultra", "Mac15,14", "Mac Studio", 6, True, 512),
    "m4-max": Preset("Apple M4 Max", "Mac16,9", "Mac Studio", 4, True, 128),
    "m4-pro-mini": Preset("Apple M4 Pro", "Mac16,11", "Mac mini", 3, True, 64),
    "m2-ultra": Preset("Apple M2 Ultra", "Mac14,14", "Mac Studio", 6, False, 192),
}
# en numbers of ports 1..n: deliberately not in port order; rotated per host.
_IFACE_ORDER = {6: [2, 7, 3, 5, 4, 6], 4: [2, 5, 3, 4], 3: [2, 4, 3]}


@dataclass
class SynthHost:
    name: str
    preset: str = "m3-ultra"
    macos: str = "26.2"
    build: str = "25C56"
    rdma: bool = True  # `rdma_ctl status` says enabled
    memory_gb: int | None = None  # default: the preset's
    bridge: tuple[int, ...] = ()  # ports whose interface sits in bridge0
    bridge_active: bool = True
    docks: tuple[int, ...] = ()  # ports with a dock/drive plugged in (not a Mac)
    missing: frozenset[str] = frozenset()  # snapshot files left out
    garbage: frozenset[str] = frozenset()  # snapshot files holding unparsable text
    linux: bool = False  # a Linux box: the macOS commands fail
    ips: tuple[str, ...] = ()  # host.yaml `ips:`
    ssh: str | None = None  # host.yaml `ssh:`
    lan_ip: str | None = "auto"  # en0's address ("auto": 192.168.1.<10+i>, None: no address)
    uuid_seed: str | None = None  # same seed as another host = the same Mac
    versions: dict[str, str | None] | None = None  # versions.txt (None: not recorded)

    @property
    def hw(self) -> Preset:
        return PRESETS[self.preset]


@dataclass
class Cable:
    a: str
    a_port: int
    b: str
    b_port: int
    speed: float = 80.0
    one_sided: bool = False  # b's end does not see a
    rdma_down: bool = False  # ibv_devinfo says PORT_DOWN on both ends anyway
    # Each end's IPv4 address: "auto" = 10.0.<cable index>.<1 or 2>, None = no address.
    a_ip: str | None = "auto"
    b_ip: str | None = "auto"
    prefix: int = 30


def bus_uuid(seed: str, port: int) -> str:
    h = hashlib.sha256(seed.encode()).hexdigest()[:8].upper()
    return f"{h}-0000-4000-8000-{port:012X}"


@dataclass
class Cluster:
    hosts: list[SynthHost]
    cables: list[Cable] = field(default_factory=list)

    def host(self, name: str) -> SynthHost:
        return next(h for h in self.hosts if h.name == name)

    def iface(self, name: str, port: int) -> str:
        i = next(i for i, h in enumerate(self.hosts) if h.name == name)
        order = _IFACE_ORDER[self.hosts[i].hw.ports]
        rot = i % len(order)
        return f"en{(order[rot:] + order[:rot])[port - 1]}"

    def used(self, name: str) -> set[int]:
        ends = [(c.a, c.a_port) for c in self.cables] + [(c.b, c.b_port) for c in self.cables]
        return {p for h, p in ends if h == name} | set(self.host(name).docks)

    def rdma_less_port(self, name: str) -> int | None:
        """The Mac Studio port next to Ethernet (interface en2): no RDMA there."""
        if not self.host(name).hw.studio:
            return None
        ports = range(1, self.host(name).hw.ports + 1)
        return next((p for p in ports if self.iface(name, p) == "en2"), None)

    def free_port(self, name: str) -> int:
        skip = self.used(name) | {self.rdma_less_port(name)}
        free = [p for p in range(1, self.host(name).hw.ports + 1) if p not in skip]
        if not free:
            raise ValueError(f"{name} has no free port")
        return free[0]

    def cable(
        self,
        a: str,
        b: str,
        a_port: int | None = None,
        b_port: int | None = None,
        **kw: object,
    ) -> Cable:
        c = Cable(a, a_port or self.free_port(a), b, b_port or self.free_port(b), **kw)  # type: ignore[arg-type]
        self.cables.append(c)
        return c

    def _seed(self, h: SynthHost) -> str:
        return h.uuid_seed or h.name

    def _ends(self, name: str) -> dict[int, tuple[Cable, str, int, bool]]:
        """port -> (cable, peer, peer port, this end sees the peer)."""
        out = {}
        for c in self.cables:
            if c.a == name:
                out[c.a_port] = (c, c.b, c.b_port, True)
            if c.b == name:
                out[c.b_port] = (c, c.a, c.a_port, not c.one_sided)
        return out

    def _rdma_live(self, h: SynthHost) -> bool:
        return h.rdma and h.hw.tb5 and not h.linux

    def _port_active(self, h: SynthHost, port: int) -> bool:
        end = self._ends(h.name).get(port)
        if end is None or not self._rdma_live(h):
            return False
        cable, peer, _, _ = end
        return self._rdma_live(self.host(peer)) and not cable.one_sided and not cable.rdma_down

    # --- the command outputs -------------------------------------------------------------

    def _thunderbolt(self, h: SynthHost) -> str:
        buses = []
        ends = self._ends(h.name)
        for port in range(h.hw.ports, 0, -1):  # system_profiler lists the last bus first
            tag: dict[str, object] = {
                "current_speed_key": f"Up to {120 if h.hw.tb5 else 40} Gb/s",
                "link_status_key": "0x100",
                "receptacle_id_key": str(port),
                "receptacle_status_key": "receptacle_no_devices_connected",
            }
            bus: dict[str, object] = {}
            if port in ends or port in h.docks:
                speed = 80.0 if port in h.docks else ends[port][0].speed
                if not h.hw.tb5:
                    speed = min(speed, 40.0)
                tag.update(
                    current_speed_key=f"{speed:g} Gb/s",
                    link_status_key="0x2",
                    micro_version_key="0.0.0",
                    receptacle_status_key="receptacle_connected",
                )
            if port in h.docks:
                bus["_items"] = [
                    {"_name": "TB5 Dock", "device_name_key": "TB5 Dock", "vendor_name_key": "OWC"}
                ]
            elif port in ends and ends[port][3]:
                _, peer, peer_port, _ = ends[port]
                p = self.host(peer)
                services = [{"_name": "service_ip", "protocol_id_key": 1, "service_uuid_key": "0"}]
                if p.rdma and not p.linux:
                    services.append({"_name": "unknown_xd_service", "protocol_id_key": 64087})
                item = {
                    "_name": p.hw.device_name,
                    "device_name_key": p.hw.hw_model,
                    "domain_uuid_key": bus_uuid(self._seed(p), peer_port),
                    "services_title": services,
                    "vendor_name_key": "Apple Inc.",
                }
                bus["_items"] = [item]
            bus.update(
                _name=f"thunderboltusb4_bus_{port - 1}",
                device_name_key=h.hw.device_name,
                domain_uuid_key=bus_uuid(self._seed(h), port),
                receptacle_1_tag=tag,
                vendor_name_key="Apple Inc.",
            )
            buses.append(bus)
        return json.dumps({"SPThunderboltDataType": buses}, indent=2) + "\n"

    def _networksetup(self, h: SynthHost) -> str:
        blocks = [("Ethernet", "en0"), ("Wi-Fi", "en1"), ("Thunderbolt Bridge", "bridge0")]
        blocks += [(f"Thunderbolt {p}", self.iface(h.name, p)) for p in range(1, h.hw.ports + 1)]
        text = "".join(
            f"Hardware Port: {n}\nDevice: {d}\nEthernet Address: 02:00:00:00:{i:02x}:01\n\n"
            for i, (n, d) in enumerate(blocks)
        )
        return text + "VLAN Configurations\n===================\n"

    def _devices(self, h: SynthHost) -> list[str]:
        if not self._rdma_live(h):
            return []
        return [f"rdma_{self.iface(h.name, p)}" for p in range(1, h.hw.ports + 1)]

    def _ibv_devices(self, h: SynthHost) -> str:
        rows = [f"    {d:<16}\t{i:016x}\n" for i, d in enumerate(self._devices(h), 1)]
        return (
            "    device          \t   node GUID\n    ------          \t----------------\n"
            + "".join(rows)
        )

    def _ibv_devinfo(self, h: SynthHost) -> str | None:
        blocks = []
        for p in range(1, h.hw.ports + 1) if self._devices(h) else ():
            state = "PORT_ACTIVE (4)" if self._port_active(h, p) else "PORT_DOWN (1)"
            blocks.append(
                f"hca_id:\trdma_{self.iface(h.name, p)}\n\ttransport:\t\t\tThunderbolt (100)\n"
                f"\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n\t\t\tstate:\t\t\t{state}\n"
                "\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tlink_layer:\t\tThunderbolt\n"
            )
        return "\n".join(blocks) if blocks else None

    def _ifconfig(self, h: SynthHost, index: int) -> str:
        up = "flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500"
        out = [
            "lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384\n"
            "\tinet 127.0.0.1 netmask 0xff000000\n\tinet6 ::1 prefixlen 128\n"
        ]
        lan = f"192.168.1.{10 + index}" if h.lan_ip == "auto" else h.lan_ip
        addr = f"\tinet {lan} netmask 0xffffff00 broadcast 192.168.1.255\n" if lan else ""
        out.append(f"en0: {up}\n\tether 02:00:00:00:00:01\n{addr}\tstatus: active\n")
        ends = self._ends(h.name)
        bridged = {self.iface(h.name, p) for p in h.bridge}
        for p in range(1, h.hw.ports + 1):
            iface = self.iface(h.name, p)
            inet = ""
            if p in ends and iface not in bridged:
                c = ends[p][0]
                n = self.cables.index(c)
                end = 1 if c.a == h.name else 2
                ip = c.a_ip if end == 1 else c.b_ip
                if ip == "auto":
                    ip = f"10.0.{n}.{end}"
                inet = inet_line(ip, c.prefix) if ip else ""
            status = "active" if p in ends or p in h.docks else "inactive"
            out.append(
                f"{iface}: {up}\n\tether 36:00:00:00:{index:02x}:{p:02x}\n"
                f"{inet}\tstatus: {status}\n"
            )
        members = "".join(
            f"\tmember: {i} flags=3<LEARNING,DISCOVER>\n\t        ifmaxaddr 0 port 9\n"
            for i in sorted(bridged)
        )
        if bridged:
            flags, status = (
                (up, "active") if h.bridge_active else (up.replace("UP,", ""), "inactive")
            )
        else:
            flags, status = "flags=8822<BROADCAST,SMART,SIMPLEX,MULTICAST> mtu 1500", "inactive"
        out.append(
            f"bridge0: {flags}\n\tConfiguration:\n\t\tid 0:0:0:0:0:0 priority 0\n{members}"
            f"\tmedia: <unknown type>\n\tstatus: {status}\n"
        )
        return "".join(out)

    def _linux_files(self, h: SynthHost, index: int) -> dict[str, str | None]:
        files: dict[str, str | None] = {"uname.txt": "Linux\n"}
        for f, cmd in _MAC_COMMANDS.items():
            files[f] = None
            files[f + ".error"] = (
                f"`{cmd}` failed (exit 127): bash: line 1: {cmd.split()[0]}: command not found\n"
            )
        files["sysctl.txt.error"] = (
            "`sysctl ...` failed (exit 255): sysctl: cannot stat /proc/sys/hw/memsize\n"
        )
        files["ifconfig.txt"] = (
            f"eth0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500\n"
            f"        inet 10.9.0.{10 + index}  netmask 255.255.255.0  broadcast 10.9.0.255\n\n"
            "lo: flags=73<UP,LOOPBACK,RUNNING>  mtu 65536\n"
            "        inet 127.0.0.1  netmask 255.0.0.0\n"
        )
        return files

    def host_files(self, h: SynthHost) -> dict[str, str | None]:
        index = self.hosts.index(h)
        if h.linux:
            files = self._linux_files(h, index)
        else:
            hw = h.hw
            memory = (h.memory_gb or hw.memory_gb) << 30
            files = {
                "uname.txt": "Darwin\n",
                "system_profiler_SPThunderboltDataType.json": self._thunderbolt(h),
                "networksetup_listallhardwareports.txt": self._networksetup(h),
                "ibv_devices.txt": self._ibv_devices(h),
                "ibv_devinfo.txt": self._ibv_devinfo(h),
                "rdma_ctl_status.txt": "enabled\n" if h.rdma else "disabled\n",
                "sw_vers.txt": (
                    f"ProductName:\t\tmacOS\nProductVersion:\t\t{h.macos}\n"
                    f"BuildVersion:\t\t{h.build}\n"
                ),
                "sysctl.txt": (
                    f"hw.memsize: {memory}\nhw.model: {hw.hw_model}\n"
                    f"machdep.cpu.brand_string: {hw.chip}\n"
                ),
                "ifconfig.txt": self._ifconfig(h, index),
            }
        if h.versions is not None:
            files["versions.txt"] = "".join(f"{k} {v or '-'}\n" for k, v in h.versions.items())
        for f in h.missing:
            files[f] = None
        for f in h.garbage:
            files[f] = "{ this is not what the command prints\n"
        return files

    def files(self) -> dict[str, dict[str, str | None]]:
        return {h.name: self.host_files(h) for h in self.hosts}

    def host_yaml(self, h: SynthHost) -> dict[str, object]:
        raw: dict[str, object] = {}
        if h.ssh:
            raw["ssh"] = h.ssh
        if h.ips:
            raw["ips"] = list(h.ips)
        return raw

    def facts(self) -> tuple[HostFacts, ...]:
        return tuple(host_facts(h.name, self.host_files(h), self.host_yaml(h)) for h in self.hosts)

    def write(self, directory: Path) -> Path:
        for h in self.hosts:
            d = directory / h.name
            d.mkdir(parents=True, exist_ok=True)
            for f, text in self.host_files(h).items():
                if text is not None:
                    (d / f).write_text(text, encoding="utf-8")
            if self.host_yaml(h):
                (d / "host.yaml").write_text(yaml.safe_dump(self.host_yaml(h)), encoding="utf-8")
        return directory


def inet_line(ip: str, prefix: int) -> str:
    """An `inet` line as macOS ifconfig prints it (hex netmask, broadcast)."""
    net = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    mask = int(net.netmask)
    return f"\tinet {ip} netmask 0x{mask:08x} broadcast {net.broadcast_address}\n"


_MAC_COMMANDS = {
    "system_profiler_SPThunderboltDataType.json": "system_profiler SPThunderboltDataType -json",
    "networksetup_listallhardwareports.txt": "networksetup -listallhardwareports",
    "ibv_devices.txt": "ibv_devices",
    "ibv_devinfo.txt": "ibv_devinfo",
    "rdma_ctl_status.txt": "rdma_ctl status",
    "sw_vers.txt": "sw_vers",
}


def names(n: int, prefix: str = "studio") -> list[str]:
    return [f"{prefix}-{chr(ord('a') + i)}" for i in range(n)]


def cluster(n: int, preset: str = "m3-ultra", prefix: str = "studio", **kw: object) -> Cluster:
    """n identical hosts, no cables yet; `kw` sets SynthHost fields on every host."""
    return Cluster([SynthHost(name, preset, **kw) for name in names(n, prefix)])  # type: ignore[arg-type]


def mesh(n: int, preset: str = "m3-ultra", **kw: object) -> Cluster:
    """A full mesh: one cable between every pair, ports taken lowest-free first."""
    c = cluster(n, preset, **kw)
    for i, a in enumerate(c.hosts):
        for b in c.hosts[i + 1 :]:
            c.cable(a.name, b.name)
    return c


def ring(n: int, preset: str = "m3-ultra", **kw: object) -> Cluster:
    """A ring a-b-c-...-a (two cables per host)."""
    c = cluster(n, preset, **kw)
    for i, a in enumerate(c.hosts):
        b = c.hosts[(i + 1) % n]
        if n > 2 or i == 0:
            c.cable(a.name, b.name)
    return c
