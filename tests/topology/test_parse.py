"""The command-output parsers, on real captures and on what else a host might print."""

from __future__ import annotations

import pytest
from paths import FIXTURES

from topology.facts import IfaceAddr, RdmaDevice
from topology.parse import (
    ParseError,
    parse_hardware_ports,
    parse_ibv_devices,
    parse_ibv_devinfo,
    parse_ifconfig,
    parse_rdma_ctl,
    parse_sw_vers,
    parse_sysctl,
    parse_thunderbolt,
    thunderbolt_ifaces,
)

CAPTURE = FIXTURES / "captures" / "two-macbooks-one-cable"


def read(host: str, name: str) -> str:
    return (CAPTURE / host / name).read_text(encoding="utf-8")


def test_thunderbolt_local_capture_ports_speeds_and_peer() -> None:
    ports = {
        p.port: p
        for p in parse_thunderbolt(read("local", "system_profiler_SPThunderboltDataType.json"))
    }
    assert sorted(ports) == [1, 2, 3]
    assert ports[1].connected is False and ports[1].speed_gbps is None  # "Up to 120 Gb/s"
    assert ports[2].bus_uuid == "00000004-0000-4000-8000-000000000004"
    assert ports[2].peer_uuid == "00000003-0000-4000-8000-000000000003"
    assert ports[2].speed_gbps == 80.0
    assert ports[2].peer_rdma_service is True  # the peer advertises protocol 64087
    # The Sabrent dock on port 3 is connected at 80 Gb/s but is not a Mac.
    assert ports[3].connected is True and ports[3].peer_uuid is None
    assert all(p.iface is None for p in ports.values())  # interfaces come from networksetup


def test_thunderbolt_peer_capture_sees_local_without_rdma_service() -> None:
    ports = {
        p.port: p
        for p in parse_thunderbolt(read("peer", "system_profiler_SPThunderboltDataType.json"))
    }
    assert ports[2].peer_uuid == "00000004-0000-4000-8000-000000000004"
    assert ports[2].peer_rdma_service is False  # local has RDMA disabled
    assert ports[3].speed_gbps == 40.0 and ports[3].peer_uuid is None  # the ACASIS drive


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"SPThunderboltDataType": 3}',
        '{"SPThunderboltDataType": [1]}',
        "zsh: command not found",
    ],
)
def test_thunderbolt_rejects_what_is_not_system_profiler_json(text: str) -> None:
    with pytest.raises(ParseError):
        parse_thunderbolt(text)


def test_thunderbolt_bad_port_number_is_a_parse_error() -> None:
    bus = '{"domain_uuid_key": "u", "receptacle_1_tag": {"receptacle_id_key": "left"}}'
    with pytest.raises(ParseError, match="receptacle_id_key"):
        parse_thunderbolt('{"SPThunderboltDataType": [' + bus + "]}")


def test_hardware_ports_map_is_not_monotonic() -> None:
    ports = parse_hardware_ports(read("local", "networksetup_listallhardwareports.txt"))
    assert ports["Thunderbolt Bridge"] == "bridge0"
    assert thunderbolt_ifaces(ports) == {1: "en1", 2: "en6", 3: "en2"}
    with pytest.raises(ParseError):
        parse_hardware_ports("networksetup: command not found\n")


def test_ibv_devices_header_only_when_rdma_disabled() -> None:
    assert parse_ibv_devices(read("local", "ibv_devices.txt")) == ()
    assert parse_ibv_devices(read("peer", "ibv_devices.txt")) == (
        "rdma_en1",
        "rdma_en6",
        "rdma_en2",
    )
    m3 = (FIXTURES / "captures" / "m3-ultra-docs" / "ibv_devices.txt").read_text()
    assert parse_ibv_devices(m3) == tuple(f"rdma_en{n}" for n in (2, 3, 5, 4, 6, 7))
    for bad in ("", "bash: ibv_devices: command not found\n"):
        with pytest.raises(ParseError):
            parse_ibv_devices(bad)


def test_ibv_devinfo_port_states() -> None:
    devices = parse_ibv_devinfo(read("peer", "ibv_devinfo.txt"))
    assert devices == (
        RdmaDevice("rdma_en1", "down"),
        RdmaDevice("rdma_en6", "down"),
        RdmaDevice("rdma_en2", "down"),
    )
    active = "hca_id:\trdma_en3\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
    assert parse_ibv_devinfo(active) == (RdmaDevice("rdma_en3", "active"),)
    assert parse_ibv_devinfo("") == ()
    assert parse_ibv_devinfo("No IB devices found\n") == ()
    with pytest.raises(ParseError):
        parse_ibv_devinfo("something else entirely\n")


def test_rdma_ctl_status() -> None:
    assert parse_rdma_ctl("enabled\n") == "enabled"
    assert parse_rdma_ctl("disabled\n") == "disabled"
    with pytest.raises(ParseError):
        parse_rdma_ctl("rdma_ctl: command not found\n")


def test_sw_vers_and_sysctl() -> None:
    sw = parse_sw_vers("ProductName:\t\tmacOS\nProductVersion:\t\t26.2\nBuildVersion:\t\t25C56\n")
    assert (sw.product, sw.version, sw.build) == ("macOS", "26.2", "25C56")
    with pytest.raises(ParseError):
        parse_sw_vers("ProductName: macOS\n")
    s = parse_sysctl(
        "hw.memsize: 549755813888\nhw.model: Mac15,14\nmachdep.cpu.brand_string: Apple M3 Ultra\n"
    )
    assert (s.memsize, s.model, s.chip) == (549755813888, "Mac15,14", "Apple M3 Ultra")
    with pytest.raises(ParseError):
        parse_sysctl("hw.memsize: lots\n")
    with pytest.raises(ParseError):
        parse_sysctl("sysctl: cannot stat /proc/sys/hw/memsize\n")


MAC_IFCONFIG = """\
lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384
\tinet 127.0.0.1 netmask 0xff000000
en6: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\tinet 10.0.0.1 netmask 0xfffffffc broadcast 10.0.0.3
\tstatus: active
bridge0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\tConfiguration:
\t\tid 0:0:0:0:0:0 priority 0 hellotime 0 fwddelay 0
\tmember: en1 flags=3<LEARNING,DISCOVER>
\t        ifmaxaddr 0 port 8 priority 0 path cost 0
\tmember: en2 flags=3<LEARNING,DISCOVER>
\t        ifmaxaddr 0 port 9 priority 0 path cost 0
\tstatus: active
"""


def test_ifconfig_macos_bridge_and_slash30() -> None:
    ifc = parse_ifconfig(MAC_IFCONFIG)
    assert ifc.bridge_members == ("en1", "en2")
    assert ifc.bridge_active is True
    assert IfaceAddr("en6", "10.0.0.1", 30) in ifc.addrs
    assert IfaceAddr("lo0", "127.0.0.1", 8) in ifc.addrs
    inactive = parse_ifconfig(MAC_IFCONFIG.replace("\tstatus: active\n", "\tstatus: inactive\n"))
    assert inactive.bridge_active is False


def test_ifconfig_linux_dotted_netmask() -> None:
    text = (
        "eth0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1400\n"
        "        inet 192.0.2.2  netmask 255.255.255.0  broadcast 192.0.2.255\n"
    )
    ifc = parse_ifconfig(text)
    assert ifc.addrs == (IfaceAddr("eth0", "192.0.2.2", 24),)
    assert ifc.bridge_members == () and ifc.bridge_active is False
    with pytest.raises(ParseError):
        parse_ifconfig("ifconfig: command not found\n")
    with pytest.raises(ParseError, match="netmask"):
        parse_ifconfig("en0: flags=1<UP> mtu 1\n\tinet 10.0.0.1 netmask 0xZZ\n")
