"""Link graph from synthesized snapshots: reciprocity, interfaces, RDMA per cable, rings."""

from __future__ import annotations

import itertools

import pytest
import synth

from topology.links import find_ring, free_ports, is_full_mesh, link_graph, min_cost_cycle


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_full_mesh_of_n_m3_ultras(n: int) -> None:
    c = synth.mesh(n)
    graph = link_graph(c.facts())
    assert len(graph.links) == n * (n - 1) // 2
    assert is_full_mesh(graph, graph.names, rdma=True)
    assert all(k.rdma and k.speed_gbps == 80.0 for k in graph.links)


def test_interfaces_come_from_networksetup_not_port_numbers() -> None:
    c = synth.mesh(4)
    graph = link_graph(c.facts())
    for k in graph.links:
        assert k.a_iface == c.iface(k.a, k.a_port)
        assert k.b_iface == c.iface(k.b, k.b_port)
    # The synthetic mapping really is non-monotonic, and differs per host.
    ifaces = [[c.iface(h.name, p) for p in range(1, 7)] for h in c.hosts]
    assert any(row[i] != f"en{i + 1}" for row in ifaces for i in range(6))
    assert ifaces[0] != ifaces[1]
    # Each link's interface is one whose rdma device the host actually has.
    facts = {h.name: h for h in c.facts()}
    for k in graph.links:
        assert facts[k.a].rdma_device(k.a_iface) is not None


def test_one_sided_cable_is_not_a_link() -> None:
    c = synth.cluster(3)
    c.cable("studio-a", "studio-b")
    c.cable("studio-a", "studio-c", one_sided=True)
    graph = link_graph(c.facts())
    assert [(k.a, k.b) for k in graph.links] == [("studio-a", "studio-b")]
    assert [(s.host, s.peer) for s in graph.one_sided] == [("studio-a", "studio-c")]
    assert not graph.connected("studio-a", "studio-c")


def test_rdma_needs_both_ends_active() -> None:
    c = synth.mesh(3)
    c.host("studio-c").rdma = False
    graph = link_graph(c.facts())
    assert graph.connected("studio-a", "studio-b", rdma=True)
    assert not graph.connected("studio-a", "studio-c", rdma=True)
    assert graph.connected("studio-a", "studio-c")  # the cable is still there
    c2 = synth.cluster(2)
    c2.cable("studio-a", "studio-b", rdma_down=True)
    assert not link_graph(c2.facts()).links[0].rdma


def test_two_cables_between_one_pair_are_two_links() -> None:
    c = synth.cluster(2)
    c.cable("studio-a", "studio-b")
    c.cable("studio-a", "studio-b")
    graph = link_graph(c.facts())
    assert len(graph.between("studio-a", "studio-b")) == 2
    assert graph.used_ports("studio-a") == {2, 3}  # port 1 is studio-a's en2: no RDMA there


def test_duplicate_host_detected_by_bus_uuids_and_ssh() -> None:
    c = synth.mesh(2)
    c.hosts.append(synth.SynthHost("studio-a-again", uuid_seed="studio-a"))
    graph = link_graph(c.facts())
    assert graph.duplicates == (("studio-a", "studio-a-again"),)
    assert len(graph.links) == 1  # the copy adds no links
    c2 = synth.cluster(2, ssh="same.local")
    assert link_graph(c2.facts()).duplicates == (("studio-a", "studio-b"),)


def test_cable_to_a_mac_outside_the_cluster_is_an_unknown_peer() -> None:
    c = synth.mesh(3)
    facts = c.facts()[:2]  # studio-c left out
    graph = link_graph(facts)
    assert {(u.host, u.port) for u in graph.unknown_peers} == {("studio-a", 3), ("studio-b", 2)}


def test_free_ports_exclude_docks_and_cables() -> None:
    c = synth.cluster(2, preset="m4-pro-mini")
    c.host("studio-a").docks = (3,)
    c.cable("studio-a", "studio-b")
    a = c.facts()[0]
    assert [p.port for p in free_ports(a)] == [2]


def test_ring_found_in_a_ring_but_not_when_a_cable_is_missing() -> None:
    c = synth.ring(5)
    graph = link_graph(c.facts())
    ring = find_ring(graph, graph.names)
    assert ring is not None and sorted(ring) == sorted(graph.names)
    for a, b in itertools.pairwise((*ring, ring[0])):
        assert graph.connected(a, b, rdma=True)
    assert not is_full_mesh(graph, graph.names)
    c.cables.pop()
    graph = link_graph(c.facts())
    assert find_ring(graph, graph.names) is None
    assert find_ring(graph, graph.names, rdma=False) is None


def test_ring_of_two_and_one() -> None:
    graph = link_graph(synth.mesh(2).facts())
    assert find_ring(graph, graph.names) == ("studio-a", "studio-b")
    assert find_ring(graph, ["studio-a"]) == ("studio-a",)


def test_min_cost_cycle_picks_the_cheapest_hamiltonian_cycle() -> None:
    names = ["a", "b", "c", "d"]
    # a-b, b-c, c-d ready; d-a missing (cost 1 by default); a-c and b-d cost 5.
    cost = {("a", "b"): 0, ("b", "c"): 0, ("c", "d"): 0, ("a", "c"): 5, ("b", "d"): 5}
    ring, total = min_cost_cycle(names, cost)
    assert total == 1
    assert ring == ("a", "b", "c", "d")
