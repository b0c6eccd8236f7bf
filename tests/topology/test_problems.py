"""Every problem code on synthesized 2–8 host snapshots; severity follows the target backend."""

from __future__ import annotations

import re

import pytest
import synth

from topology.errors import InputError
from topology.facts import CheckResult, Problem
from topology.host_facts import host_facts
from topology.problems import CODE_ORDER, check


def only(result: CheckResult, code: str) -> list[Problem]:
    return [p for p in result.problems if p.code == code]


def severities(result: CheckResult, code: str) -> set[str]:
    return {p.severity for p in only(result, code)}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_healthy_mesh_is_ready_for_every_backend(n: int) -> None:
    facts = synth.mesh(n).facts()
    for target in ("auto", "jaccl", "jaccl-ring", "ring"):
        result = check(facts, target)
        assert result.ok and result.backend == "jaccl" and result.problems == (), target


def test_mixed_macs_full_mesh_of_three_is_ready() -> None:
    c = synth.Cluster(
        [
            synth.SynthHost("ultra"),
            synth.SynthHost("max", "m4-max"),
            synth.SynthHost("mini", "m4-pro-mini"),
        ]
    )
    c.cable("ultra", "max")
    c.cable("ultra", "mini")
    c.cable("max", "mini")
    assert check(c.facts()).backend == "jaccl"


def test_eight_m3_ultras_cannot_full_mesh_but_ring_works() -> None:
    c = synth.cluster(8)
    names = [h.name for h in c.hosts]
    # 5 of an M3 Ultra's 6 ports do RDMA: each Mac cabled to 5 of the 7 others, 3 apart unpaired.
    unpaired = {frozenset((names[i], names[(i + 3) % 8])) for i in range(8)}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if frozenset((a, b)) not in unpaired:
                c.cable(a, b)
    result = check(c.facts())
    assert result.backend == "jaccl-ring" and not result.ok
    missing = only(result, "missing_link")
    assert {frozenset(p.hosts) for p in missing} == unpaired
    assert all(p.severity == "error" and "no free Thunderbolt port" in p.fix for p in missing)
    assert all("--backend jaccl-ring" in p.fix for p in missing)
    ring = check(c.facts(), "jaccl-ring")
    assert ring.ok and severities(ring, "missing_link") == {"warning"}


def test_missing_links_name_distinct_free_ports() -> None:
    c = synth.ring(5)  # 6 ports each: 2 used by the ring, 3 free with RDMA, en2 free without
    result = check(c.facts())
    missing = only(result, "missing_link")
    assert len(missing) == 5  # 10 pairs, 5 cabled
    taken: set[tuple[str, int]] = set()
    for p in missing:
        m = re.fullmatch(
            r"Connect a Thunderbolt 5 cable from (\S+) port (\d) \((en\d)\) "
            r"to (\S+) port (\d) \((en\d)\)\.",
            p.fix,
        )
        assert m, p.fix
        for host, port, iface in ((m[1], int(m[2]), m[3]), (m[4], int(m[5]), m[6])):
            assert (host, port) not in taken  # never the same free port twice
            taken.add((host, port))
            assert port not in {cab.a_port for cab in c.cables if cab.a == host}
            assert port not in {cab.b_port for cab in c.cables if cab.b == host}
            assert iface == c.iface(host, port) and iface != "en2"  # never the RDMA-less port
    assert result.backend == "jaccl-ring"


@pytest.mark.parametrize("n", [3, 5, 8, 12])
def test_broken_ring_blocks_jaccl_ring_on_the_missing_cable_only(n: int) -> None:
    c = synth.ring(n)
    gone = c.cables.pop(1)  # studio-b <-> studio-c
    result = check(c.facts(), "jaccl-ring")
    errors = [p for p in result.problems if p.severity == "error"]
    assert [(p.code, set(p.hosts)) for p in errors] == [("missing_link", {gone.a, gone.b})]
    assert "close a ring" in errors[0].message
    assert result.backend == "ring"


@pytest.mark.parametrize("n", [2, 4, 8])
def test_rdma_disabled(n: int) -> None:
    c = synth.ring(n)
    c.host("studio-b").rdma = False
    facts = c.facts()
    for target, severity in (("jaccl", "error"), ("jaccl-ring", "error"), ("ring", "warning")):
        result = check(facts, target)
        [p] = only(result, "rdma_disabled")
        assert p.hosts == ("studio-b",) and p.severity == severity
        assert "Recovery" in p.fix and "`rdma_ctl enable`" in p.fix and "studio-b" in p.fix
    assert check(facts).backend == "ring"
    assert only(check(facts), "rdma_port_down") == []  # the host problem says it already


def test_single_mac_needs_no_rdma() -> None:
    c = synth.cluster(1, rdma=False)
    result = check(c.facts())
    assert result.ok and severities(result, "rdma_disabled") == {"warning"}


def test_rdma_no_devices_on_tb4_class_mac() -> None:
    c = synth.Cluster([synth.SynthHost("studio-a"), synth.SynthHost("old", "m2-ultra")])
    c.cable("studio-a", "old")
    result = check(c.facts())
    [p] = only(result, "rdma_no_devices")
    assert p.hosts == ("old",) and p.severity == "error" and "ibv_reg_mr" in p.message
    assert severities(result, "slow_link") == {"warning"}  # TB4 links at 40 Gb/s
    assert result.backend == "ring"


@pytest.mark.parametrize(("n", "backend"), [(3, "ring"), (4, "jaccl-ring")])
def test_rdma_port_down_names_the_cable(n: int, backend: str) -> None:
    c = synth.mesh(n)
    c.cables[0].rdma_down = True  # studio-a <-> studio-b
    result = check(c.facts())
    [p] = only(result, "rdma_port_down")
    assert p.severity == "error" and p.hosts == ("studio-a", "studio-b")
    assert "studio-a port 2" in p.fix and "studio-b port 1" in p.fix  # studio-a's 1 is en2
    # A ring of 3 needs every pair; with 4 Macs a ring can go around the dead cable.
    assert result.backend == backend
    assert check(c.facts(), "jaccl-ring").ok is (backend == "jaccl-ring")


def test_rdma_port_down_with_a_second_good_cable_is_a_warning() -> None:
    c = synth.mesh(2)
    c.cable("studio-a", "studio-b", rdma_down=True)
    result = check(c.facts())
    assert result.ok and severities(result, "rdma_port_down") == {"warning"}


def test_macos_too_old_and_mismatch() -> None:
    c = synth.mesh(4)
    c.host("studio-b").macos = "15.6"
    c.host("studio-c").macos = "26.3"
    result = check(c.facts())
    [old] = only(result, "macos_too_old")
    assert old.hosts == ("studio-b",) and old.severity == "error" and "26.2" in old.fix
    [mis] = only(result, "macos_mismatch")
    assert mis.hosts == ("studio-a", "studio-b", "studio-d")
    assert "macOS 26.3" in mis.fix
    ring = check(c.facts(), "ring")
    assert ring.ok and severities(ring, "macos_too_old") == {"warning"}


def test_asymmetric_link() -> None:
    c = synth.mesh(3)
    c.cables[2].one_sided = True  # studio-b <-> studio-c seen from b only
    result = check(c.facts())
    [p] = only(result, "asymmetric_link")
    assert p.severity == "error" and set(p.hosts) == {"studio-b", "studio-c"}
    assert "replug" in p.fix
    assert only(result, "missing_link") == []


def test_slow_link_is_only_a_warning() -> None:
    c = synth.mesh(3)
    c.cables[0].speed = 40.0
    result = check(c.facts())
    [p] = only(result, "slow_link")
    assert p.severity == "warning" and "40 Gb/s" in p.message
    assert result.ok and result.backend == "jaccl"


def test_tb_bridge_active() -> None:
    c = synth.mesh(3)
    c.host("studio-b").bridge = (1, 2)
    result = check(c.facts())
    [p] = only(result, "tb_bridge_active")
    ifaces = sorted(c.iface("studio-b", port) for port in (1, 2))
    assert p.severity == "error"
    for iface in ifaces:
        assert f"sudo ifconfig bridge0 deletem {iface}" in p.fix
    assert "System Settings → Network → Thunderbolt Bridge" in p.fix
    assert check(c.facts(), "ring").ok
    c.host("studio-b").bridge_active = False
    assert only(check(c.facts()), "tb_bridge_active") == []


def test_duplicate_host_blocks_everything() -> None:
    c = synth.mesh(2)
    c.hosts.append(synth.SynthHost("studio-a2", uuid_seed="studio-a"))
    result = check(c.facts(), "ring")
    [p] = only(result, "duplicate_host")
    assert p.hosts == ("studio-a", "studio-a2") and p.severity == "error"
    assert result.backend is None


def test_not_a_mac_leaves_only_ring() -> None:
    c = synth.mesh(2)
    c.hosts.append(synth.SynthHost("linux-box", linux=True))
    result = check(c.facts())
    [p] = only(result, "not_a_mac")
    assert p.severity == "error" and "not a Mac" in p.message and "command not found" in p.message
    assert result.backend == "ring"
    assert only(result, "probe_missing") == []  # its failures are the not_a_mac finding
    ring = check(c.facts(), "ring")
    assert ring.ok and severities(ring, "not_a_mac") == {"warning"}


def test_linux_hosts_without_address_need_ips() -> None:
    c = synth.cluster(2, linux=True)
    assert check(c.facts(), "ring").ok  # ifconfig shows eth0
    for h in c.hosts:
        h.missing = frozenset({"ifconfig.txt"})
    assert severities(check(c.facts(), "ring"), "no_address") == {"error"}
    for h in c.hosts:
        h.ips = ("10.0.0.1",)
    assert check(c.facts(), "ring").ok


def test_no_address_on_a_mac() -> None:
    c = synth.cluster(2, lan_ip=None)
    result = check(c.facts(), "ring")
    assert severities(result, "no_address") == {"error"}
    assert "`ips: [...]`" in only(result, "no_address")[0].fix


@pytest.mark.parametrize(
    "file",
    [
        "system_profiler_SPThunderboltDataType.json",
        "networksetup_listallhardwareports.txt",
        "ibv_devices.txt",
        "ibv_devinfo.txt",
        "sw_vers.txt",
        "ifconfig.txt",
    ],
)
def test_probe_missing_blocking_files(file: str) -> None:
    c = synth.mesh(3)
    c.host("studio-c").missing = frozenset({file})
    result = check(c.facts())
    [p] = only(result, "probe_missing")
    assert p.hosts == ("studio-c",) and file in p.message and p.severity == "error"
    assert f"studio-c/{file}" in p.fix
    c.host("studio-c").missing = frozenset()
    c.host("studio-c").garbage = frozenset({file})
    [p] = only(check(c.facts()), "probe_missing")
    assert "unparsable" in p.message


def test_probe_missing_sysctl_and_rdma_ctl_do_not_block_when_known_otherwise() -> None:
    c = synth.mesh(2)
    c.host("studio-b").missing = frozenset({"sysctl.txt", "rdma_ctl_status.txt"})
    result = check(c.facts())
    assert result.ok and severities(result, "probe_missing") == {"warning"}
    assert len(only(result, "probe_missing")) == 2


def test_unreachable_host_is_one_problem() -> None:
    c = synth.mesh(2)
    files = c.files()
    reason = "ssh failed (exit 255): ssh: connect to host studio-b port 22: Connection refused"
    files["studio-b"] = {"uname.txt": None, "uname.txt.error": reason}
    for f in synth._MAC_COMMANDS | {"sysctl.txt": "", "ifconfig.txt": ""}:
        files["studio-b"][f] = None
        files["studio-b"][f + ".error"] = reason
    result = check([host_facts(n, fs) for n, fs in files.items()], "ring")
    [p] = only(result, "probe_missing")
    assert "Connection refused" in p.message and p.severity == "error"
    assert "ssh studio-b true" in p.fix


def test_unknown_peer_and_too_many_hosts() -> None:
    facts = synth.mesh(3).facts()[:2]
    result = check(facts)
    assert {p.hosts for p in only(result, "unknown_peer")} == {("studio-a",), ("studio-b",)}
    assert result.ok
    many = check(synth.cluster(9).facts(), "jaccl-ring")
    assert severities(many, "too_many_hosts") == {"warning"}
    assert severities(check(synth.cluster(9).facts()), "too_many_hosts") == {"error"}


def test_order_is_deterministic_errors_first_then_code_order() -> None:
    c = synth.mesh(4)
    c.host("studio-d").rdma = False
    c.host("studio-a").bridge = (1,)
    c.cables[0].speed = 40.0
    c.cables.pop()
    first, second = check(c.facts()), check(c.facts())
    assert first.problems == second.problems
    sev = [p.severity for p in first.problems]
    assert sev == sorted(sev)  # "error" < "warning"
    errors = [CODE_ORDER.index(p.code) for p in first.problems if p.severity == "error"]
    assert errors == sorted(errors)
    assert all(p.fix and p.message for p in first.problems)


def test_bad_target_is_input_error() -> None:
    with pytest.raises(InputError, match="--backend"):
        check(synth.mesh(2).facts(), "mpi")
    with pytest.raises(InputError):
        check([], "auto")
