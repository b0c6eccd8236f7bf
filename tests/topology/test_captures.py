"""The real two-MacBook capture (one TB5 cable; local RDMA off, peer on) read end to end."""

from __future__ import annotations

from pathlib import Path

from paths import FIXTURES

from topology.facts import SNAPSHOT_FILES, HostFacts
from topology.host_facts import host_facts
from topology.links import link_graph
from topology.problems import check

CAPTURE = FIXTURES / "captures" / "two-macbooks-one-cable"


def files_of(d: Path) -> dict[str, str | None]:
    return {f: (d / f).read_text() if (d / f).is_file() else None for f in SNAPSHOT_FILES}


def facts() -> tuple[HostFacts, HostFacts]:
    return host_facts("local", files_of(CAPTURE / "local")), host_facts(
        "peer", files_of(CAPTURE / "peer")
    )


def test_exactly_one_link_port2_en6_at_80() -> None:
    graph = link_graph(facts())
    assert len(graph.links) == 1
    k = graph.links[0]
    assert (k.a, k.a_port, k.a_iface) == ("local", 2, "en6")
    assert (k.b, k.b_port, k.b_iface) == ("peer", 2, "en6")
    assert k.speed_gbps == 80.0
    assert k.rdma is False  # local has RDMA off: no device there, and the peer's port is down
    assert graph.one_sided == () and graph.unknown_peers == ()


def test_docks_and_drives_are_not_links_and_ports_map_through_networksetup() -> None:
    local, peer = facts()
    by_port = {p.port: p for p in local.tb_ports}
    assert {p: by_port[p].iface for p in by_port} == {1: "en1", 2: "en6", 3: "en2"}
    assert by_port[3].connected and by_port[3].peer_uuid is None  # the Sabrent dock
    assert {p.port: p.peer_uuid is None for p in peer.tb_ports}[3]  # the ACASIS drive


def test_rdma_state_local_disabled_peer_enabled_ports_down() -> None:
    local, peer = facts()
    # No rdma_ctl_status.txt in the capture: the state follows from ibv_devices.
    assert local.rdma == "disabled" and local.rdma_devices == ()
    assert peer.rdma == "enabled"
    assert [(d.name, d.state) for d in peer.rdma_devices] == [
        ("rdma_en1", "down"),
        ("rdma_en6", "down"),
        ("rdma_en2", "down"),
    ]
    # Each side's view of the other's RDMA service agrees.
    assert next(p for p in local.tb_ports if p.port == 2).peer_rdma_service is True
    assert next(p for p in peer.tb_ports if p.port == 2).peer_rdma_service is False


def test_check_on_capture_names_local_rdma_and_missing_files() -> None:
    result = check(facts())
    codes = {(p.code, p.hosts) for p in result.problems}
    assert ("rdma_disabled", ("local",)) in codes
    assert ("rdma_disabled", ("peer",)) not in codes
    missing = {p.message for p in result.problems if p.code == "probe_missing"}
    assert "local: sw_vers.txt: missing" in missing
    assert "peer: ifconfig.txt: missing" in missing
    # The local ibv_devinfo is absent but not needed (no devices to describe).
    assert not any("local: ibv_devinfo" in m for m in missing)
    assert not result.ok and result.backend is None  # no ifconfig: not even an address known
