"""host_facts: a host's files -> HostFacts; a missing or unparsable file is a gap, never a raise."""

from __future__ import annotations

import pytest
import synth

from topology.facts import SNAPSHOT_FILES
from topology.host_facts import host_facts


def one_host(**kw: object) -> synth.Cluster:
    c = synth.Cluster([synth.SynthHost("studio-a", **kw), synth.SynthHost("studio-b")])  # type: ignore[arg-type]
    c.cable("studio-a", "studio-b")
    return c


def test_full_mac() -> None:
    c = one_host()
    h = host_facts("studio-a", c.files()["studio-a"], {"ssh": "a.local", "ips": ["10.0.0.1"]})
    assert (h.chip, h.hw_model, h.memory_bytes) == ("Apple M3 Ultra", "Mac15,14", 512 << 30)
    assert (h.macos, h.macos_build, h.is_mac, h.rdma) == ("26.2", "25C56", True, "enabled")
    assert (h.ssh, h.ips, h.gaps) == ("a.local", ("10.0.0.1",), ())
    assert len(h.tb_ports) == 6 and len(h.rdma_devices) == 6
    used = c.cables[0].a_port  # port 1 is en2 here, the RDMA-less one: the cable skips it
    port = next(p for p in h.tb_ports if p.port == used)
    assert used != 1 and c.iface("studio-a", 1) == "en2"
    assert port.iface == c.iface("studio-a", used) and port.peer_uuid is not None
    assert h.rdma_device(port.iface) is not None and h.rdma_device(port.iface).state == "active"  # type: ignore[union-attr]
    assert any(a.prefix == 30 for a in h.addrs)


@pytest.mark.parametrize("file", SNAPSHOT_FILES)
def test_any_missing_or_garbage_file_is_a_gap(file: str) -> None:
    for kw in ({"missing": frozenset({file})}, {"garbage": frozenset({file})}):
        h = host_facts("studio-a", one_host(**kw).files()["studio-a"])
        assert [g.file for g in h.gaps] == [file], kw


def test_every_file_missing_still_gives_facts() -> None:
    h = host_facts("x", {})
    assert h.is_mac and h.rdma == "unknown" and h.tb_ports == ()
    assert {g.file for g in h.gaps} == set(SNAPSHOT_FILES) - {"ibv_devinfo.txt"}


def test_gap_reason_comes_from_the_error_file() -> None:
    files = one_host(missing=frozenset({"ibv_devices.txt"})).files()["studio-a"]
    files["ibv_devices.txt.error"] = "`ibv_devices` failed (exit 1): no permission\nmore\n"
    h = host_facts("studio-a", files)
    assert h.gaps[0].reason == "`ibv_devices` failed (exit 1): no permission"


def test_linux_is_not_a_mac_by_uname_or_by_failed_sw_vers() -> None:
    files = synth.Cluster([synth.SynthHost("box", linux=True)]).files()["box"]
    h = host_facts("box", files)
    assert not h.is_mac and h.macos is None and h.rdma == "unknown"
    assert h.addrs[0].ip.startswith("10.9.0.")
    del files["uname.txt"]
    assert not host_facts("box", files).is_mac  # sw_vers: command not found
    linux_sw = "ProductName: Ubuntu\nProductVersion: 24.04\n"
    assert not host_facts("box", {"sw_vers.txt": linux_sw}).is_mac


def test_rdma_state_without_rdma_ctl_follows_ibv_devices() -> None:
    on = one_host(missing=frozenset({"rdma_ctl_status.txt"}))
    assert host_facts("studio-a", on.files()["studio-a"]).rdma == "enabled"
    off = one_host(rdma=False, missing=frozenset({"rdma_ctl_status.txt"}))
    assert host_facts("studio-a", off.files()["studio-a"]).rdma == "disabled"


def test_tb4_class_rdma_enabled_without_devices() -> None:
    c = synth.Cluster([synth.SynthHost("old", "m2-ultra")])
    h = host_facts("old", c.files()["old"])
    assert h.rdma == "enabled" and h.rdma_devices == ()
    assert h.gaps == ()  # no ibv_devinfo needed when there is no device


def test_host_yaml_settings() -> None:
    h = host_facts(
        "a", {}, {"ssh": "me@a", "ips": ["10.0.0.2"], "wired_limit_gb": 480, "bandwidth_gbs": 800}
    )
    assert h.ssh == "me@a" and h.ips == ("10.0.0.2",)
    assert h.wired_limit_bytes == 480 << 30 and h.bandwidth_gbs == 800
