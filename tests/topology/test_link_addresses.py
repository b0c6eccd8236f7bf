"""link_no_address and link_address_mismatch on synthesized 2–8 host snapshots: which cables each
backend uses decides the severity."""

from __future__ import annotations

import pytest
import synth

from topology.facts import CheckResult, Problem
from topology.problems import check


def only(result: CheckResult, code: str) -> list[Problem]:
    return [p for p in result.problems if p.code == code]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_a_bare_cable_blocks_jaccl_in_a_mesh(n: int) -> None:
    c = synth.mesh(n)
    c.cables[-1].b_ip = None  # the last pair's second end has no address
    last = c.cables[-1]
    result = check(c.facts())
    [p] = only(result, "link_no_address")
    assert p.severity == "error" and set(p.hosts) == {last.a, last.b}
    assert f"{last.b} {c.iface(last.b, last.b_port)} has no IPv4 address" in p.message
    assert "mlx #3467" in p.message and "mlx-cluster topology setup" in p.fix
    # the ring the planner picks (a-b-...-z-a) runs over that cable too: jaccl-ring is out as well
    assert not result.ok and result.backend == "ring"
    ring = check(c.facts(), "ring")
    assert ring.ok and {q.severity for q in only(ring, "link_no_address")} == {"warning"}


@pytest.mark.parametrize("n", [3, 5, 8])
def test_jaccl_ring_needs_addresses_on_its_ring_cables_only(n: int) -> None:
    c = synth.ring(n)
    c.cable("studio-a", "studio-c", a_ip=None, b_ip=None)  # a chord: not on the ring (n > 3)
    result = check(c.facts(), "jaccl-ring")
    [p] = only(result, "link_no_address")
    assert p.severity == ("error" if n == 3 else "warning")  # with 3 Macs every pair is a ring pair
    c.cables[1].a_ip = None  # studio-b <-> studio-c: on every ring
    on_ring = check(c.facts(), "jaccl-ring")
    errors = [q for q in only(on_ring, "link_no_address") if q.severity == "error"]
    assert {frozenset(q.hosts) for q in errors} >= {frozenset({"studio-b", "studio-c"})}
    assert not on_ring.ok


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ends_in_different_subnets_are_a_mismatch_for_every_backend(n: int) -> None:
    c = synth.ring(n)
    c.cables[0].a_ip = "10.9.9.1"  # studio-a's end; studio-b's is 10.0.0.2/30
    for target in ("jaccl", "jaccl-ring", "ring"):
        result = check(c.facts(), target)
        [p] = only(result, "link_address_mismatch")
        assert p.severity == "error" and p.hosts == ("studio-a", "studio-b"), target
        assert "not in one subnet" in p.message and "10.9.9.1/30" in p.message
        assert "10.0.0.2/30" in p.message and "topology setup" in p.fix


def test_a_subnet_shared_with_another_interface_is_a_mismatch() -> None:
    c = synth.mesh(3)
    c.cables[0].a_ip, c.cables[0].b_ip, c.cables[0].prefix = "192.168.1.100", "192.168.1.101", 24
    result = check(c.facts())  # studio-a's LAN en0 is 192.168.1.10/24 as well
    [p] = only(result, "link_address_mismatch")
    assert "overlaps studio-a's en0" in p.message and p.severity == "error"


def test_the_same_address_on_both_ends_is_a_mismatch() -> None:
    c = synth.mesh(2)
    c.cables[0].a_ip = c.cables[0].b_ip = "10.5.0.1"
    [p] = only(check(c.facts()), "link_address_mismatch")
    assert p.hosts == ("studio-a", "studio-b")


def test_link_local_addresses_do_not_count() -> None:
    c = synth.mesh(2)
    c.cables[0].a_ip, c.cables[0].b_ip, c.cables[0].prefix = "169.254.3.1", "169.254.3.2", 16
    [p] = only(check(c.facts()), "link_no_address")
    assert "studio-a" in p.message and "studio-b" in p.message and "have no IPv4" in p.message


def test_each_of_two_cables_between_a_pair_needs_its_own_address() -> None:
    c = synth.mesh(2)
    c.cable("studio-a", "studio-b", a_ip=None, b_ip=None)
    result = check(c.facts())
    [p] = only(result, "link_no_address")
    second = c.cables[1]
    assert c.iface("studio-a", second.a_port) in p.message
    assert len(result.links) == 2 and p.severity == "error"


def test_unknown_addresses_are_probe_missing_not_link_problems() -> None:
    c = synth.mesh(3)
    c.host("studio-b").missing = frozenset({"ifconfig.txt"})
    result = check(c.facts())
    assert only(result, "link_no_address") == [] and only(result, "link_address_mismatch") == []
    assert [p.hosts for p in only(result, "probe_missing")] == [("studio-b",)]


def test_bridged_ports_hold_no_address_of_their_own() -> None:
    c = synth.mesh(3)
    c.host("studio-a").bridge = (2,)
    result = check(c.facts())
    assert {p.code for p in result.problems} == {"tb_bridge_active", "link_no_address"}
