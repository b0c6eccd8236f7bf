"""rdma_port_unsupported: a cable in the Mac Studio's port next to Ethernet (en2), 2–8 hosts."""

from __future__ import annotations

import re

import pytest
import synth

from topology.facts import CheckResult, Problem
from topology.links import link_graph
from topology.planning.hostfile import rdma_matrix
from topology.problems import check


def only(result: CheckResult, code: str) -> list[Problem]:
    return [p for p in result.problems if p.code == code]


def mesh_with_en2(n: int) -> synth.Cluster:
    """A mesh where studio-a's cable to studio-b sits in studio-a's RDMA-less port."""
    c = synth.cluster(n)
    c.cable("studio-a", "studio-b", a_port=c.rdma_less_port("studio-a"))
    for i, a in enumerate(c.hosts):
        for b in c.hosts[i + 1 :]:
            if (a.name, b.name) != ("studio-a", "studio-b"):
                c.cable(a.name, b.name)
    return c


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_only_cable_of_a_pair_in_en2_blocks_jaccl_and_names_a_free_port(n: int) -> None:
    c = mesh_with_en2(n)
    result = check(c.facts())
    [p] = only(result, "rdma_port_unsupported")
    assert p.severity == "error" and p.hosts == ("studio-a",)
    assert "studio-a port 1 (en2)" in p.message and "does no RDMA" in p.message
    m = re.match(
        r"Move the cable from studio-a port 1 \(en2\) to studio-a port (\d) \((en\d)\)", p.fix
    )
    assert m, p.fix
    port, iface = int(m[1]), m[2]
    assert iface == c.iface("studio-a", port) and iface != "en2"
    assert port not in c.used("studio-a")  # a port that is free now
    assert only(result, "rdma_port_down") == []  # not a cable to reseat
    link = next(k for k in result.links if {k.a, k.b} == {"studio-a", "studio-b"})
    assert link.a_iface == "en2" and link.rdma is False
    assert not result.ok and result.backend != "jaccl"


@pytest.mark.parametrize("n", [4, 8])
def test_off_the_ring_it_is_a_warning_for_jaccl_ring(n: int) -> None:
    c = synth.ring(n)
    c.cable("studio-a", "studio-c", a_port=c.rdma_less_port("studio-a"))  # a chord in en2
    ring = check(c.facts(), "jaccl-ring")
    [p] = only(ring, "rdma_port_unsupported")
    assert p.severity == "warning" and ring.ok and check(c.facts(), "ring").ok
    assert check(c.facts(), "jaccl").ok is False


def test_with_a_second_cable_between_the_pair_it_is_only_a_warning() -> None:
    c = mesh_with_en2(2)
    c.cable("studio-a", "studio-b")
    result = check(c.facts())
    [p] = only(result, "rdma_port_unsupported")
    assert p.severity == "warning" and "nothing depends on this one" in p.message
    assert result.ok and result.backend == "jaccl"
    names = ["studio-a", "studio-b"]
    row_a = rdma_matrix(names, link_graph(c.facts()).links, ring=False)[0]
    assert row_a[1] != "rdma_en2" and row_a[1] is not None  # mlx is given the good cable only


def test_both_ends_in_en2_move_both_ends() -> None:
    c = synth.cluster(2)
    c.cable(
        "studio-a", "studio-b",
        a_port=c.rdma_less_port("studio-a"), b_port=c.rdma_less_port("studio-b"),
    )  # fmt: skip
    [p] = only(check(c.facts()), "rdma_port_unsupported")
    assert p.hosts == ("studio-a", "studio-b")
    assert p.fix.count("Move the cable from") == 2


def test_en2_on_a_mac_mini_is_a_normal_port() -> None:
    c = synth.cluster(2, preset="m4-pro-mini")
    assert c.rdma_less_port("studio-a") is None
    port = next(p for p in range(1, 4) if c.iface("studio-a", p) == "en2")
    c.cable("studio-a", "studio-b", a_port=port)
    result = check(c.facts())
    assert result.ok and result.backend == "jaccl" and only(result, "rdma_port_unsupported") == []


def test_no_free_port_says_to_unplug_one() -> None:
    c = synth.cluster(7)
    c.cable("studio-a", "studio-b", a_port=c.rdma_less_port("studio-a"))
    for other in ("studio-c", "studio-d", "studio-e", "studio-f", "studio-g"):
        c.cable("studio-a", other)  # every RDMA port of studio-a in use
    [p] = only(check(c.facts()), "rdma_port_unsupported")
    assert p.fix.startswith("Free a port on studio-a (it has no other free Thunderbolt port)")
