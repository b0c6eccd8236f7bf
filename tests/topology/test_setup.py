"""`topology setup` planned on synthesized 2–8 host snapshots, its commands written back into the
snapshots (ifconfig edited as the Macs would show it), then checked again."""

from __future__ import annotations

import ipaddress
import itertools
import json
import shlex
from typing import Any

import pytest
import synth
from snapshot_edit import apply_setup

from topology.errors import InputError
from topology.facts import CheckResult, HostFacts
from topology.host_facts import host_facts
from topology.problems import check
from topology.setup.plan import SetupPlan, plan_setup
from topology.setup.report import setup_json, setup_text
from topology.setup.subnets import SubnetPool

SETUP_CODES = {"link_no_address", "link_address_mismatch", "tb_bridge_active"}
HOST_KEYS, MANUAL_KEYS = {"name", "commands"}, {"host", "step"}
LINK_KEYS = {"a", "a_iface", "a_ip", "b", "b_iface", "b_ip", "prefix_len"}


def bare(c: synth.Cluster) -> synth.Cluster:
    """Every cable without addresses: what a freshly cabled cluster looks like."""
    for cable in c.cables:
        cable.a_ip = cable.b_ip = None
    return c


def facts_of(files: dict[str, dict[str, str | None]], c: synth.Cluster) -> tuple[HostFacts, ...]:
    return tuple(host_facts(h.name, files[h.name], c.host_yaml(h)) for h in c.hosts)


def set_up(c: synth.Cluster, target: str = "auto") -> tuple[SetupPlan, dict[str, Any], Any]:
    """Plan on c's files, run the commands on them; (plan, its JSON, files afterwards)."""
    files = c.files()
    plan = plan_setup(facts_of(files, c), target)
    obj = json.loads(json.dumps(setup_json(plan)))
    apply_setup(files, obj)
    return plan, obj, files


def codes(result: CheckResult) -> set[str]:
    return {p.code for p in result.problems}


def cases() -> list[tuple[str, synth.Cluster]]:
    out = []
    for n in range(2, 7):
        c = bare(synth.mesh(n))
        c.host("studio-a").bridge = (2, 3)  # two of its cables inside an active bridge0
        out.append((f"mesh{n}", c))
    for n in (7, 8):
        out.append((f"ring{n}", bare(synth.ring(n))))
    return out


@pytest.mark.parametrize(("name", "c"), cases(), ids=[n for n, _ in cases()])
def test_setup_makes_the_wiring_ready_and_a_second_run_has_nothing_to_do(
    name: str, c: synth.Cluster
) -> None:
    before = check(c.facts())
    assert "link_no_address" in codes(before) and not before.ok
    plan, obj, files = set_up(c)
    assert plan.target == ("jaccl" if name.startswith("mesh") else "jaccl-ring")
    assert set(obj) == {"hosts", "links", "manual"} and obj["manual"] == []
    assert all(set(h) == HOST_KEYS for h in obj["hosts"])
    assert all(set(k) == LINK_KEYS for k in obj["links"])
    assert len(obj["links"]) == len(c.cables)
    after = check(facts_of(files, c), plan.target)
    assert not codes(after) & SETUP_CODES, after.problems
    assert after.ok and after.backend == plan.target
    again = plan_setup(facts_of(files, c), plan.target)
    assert again.nothing_to_do and all(h.commands == () for h in again.hosts)
    assert setup_json(again)["links"] == obj["links"]  # the addresses just set are kept


def test_subnets_are_unique_and_avoid_every_existing_address() -> None:
    c = bare(synth.mesh(5))
    c.cables[0].a_ip, c.cables[0].b_ip = "10.77.0.1", "10.77.0.2"  # the pool's first /30, in use
    c.cables[1].a_ip, c.cables[1].prefix = "10.77.1.9", 24  # one end only: a mismatch to redo
    c.host("studio-c").lan_ip = "10.77.2.20"  # a LAN /24 inside the pool
    c.host("studio-d").ips = ("10.77.3.5",)  # a declared address: its /24 is avoided too
    existing = [
        ipaddress.IPv4Network(f"{a.ip}/{a.prefix}", strict=False)
        for h in c.facts()
        for a in h.addrs
    ]
    existing.append(ipaddress.IPv4Network("10.77.3.0/24"))
    plan, _, _ = set_up(c)
    new = [k for k in plan.links if k.new]
    assert len(new) == len(c.cables) - 1  # the one working pair is kept
    nets = [ipaddress.IPv4Network(f"{k.a_ip}/{k.prefix_len}", strict=False) for k in new]
    assert all(n.prefixlen == 30 and n.is_private for n in nets)
    for x, y in itertools.combinations(nets, 2):
        assert not x.overlaps(y)
    for net in nets:
        assert not any(net.overlaps(e) for e in existing), net
    for k in new:  # the two ends: .1 and .2 of their /30
        net = ipaddress.IPv4Network(f"{k.a_ip}/30", strict=False)
        assert (k.a_ip, k.b_ip) == (str(net[1]), str(net[2]))


def test_commands_are_networksetup_on_the_ports_service_and_bridge_deletem_first() -> None:
    c = bare(synth.mesh(3))
    c.host("studio-a").bridge = (2,)
    plan, obj, _ = set_up(c)
    a_lines = obj["hosts"][0]["commands"]
    assert a_lines[0] == f"sudo ifconfig bridge0 deletem {c.iface('studio-a', 2)}"
    for host in obj["hosts"]:
        for line in host["commands"]:
            words = shlex.split(line)
            if words[1] == "networksetup":
                # persistent, on the service named after the port (never by interface number)
                assert words[:3] == ["sudo", "networksetup", "-setmanual"]
                port = int(words[3].removeprefix("Thunderbolt "))
                link = next(
                    k for k in obj["links"]
                    if (k["a"], k["a_ip"]) == (host["name"], words[4])
                    or (k["b"], k["b_ip"]) == (host["name"], words[4])
                )  # fmt: skip
                iface = link["a_iface"] if link["a"] == host["name"] else link["b_iface"]
                assert iface == c.iface(host["name"], port)
                assert words[5] == "255.255.255.252"
    assert len(plan.hosts) == 3 and plan.commands == 1 + 2 * 3


def test_only_thunderbolt_members_leave_the_bridge() -> None:
    c = synth.mesh(2)
    c.host("studio-a").bridge = (2,)
    files = c.files()
    text = files["studio-a"]["ifconfig.txt"] or ""
    files["studio-a"]["ifconfig.txt"] = text.replace(
        "\tmedia: <unknown type>",
        "\tmember: en0 flags=3<LEARNING,DISCOVER>\n\tmedia: <unknown type>",
    )
    plan = plan_setup(facts_of(files, c))
    bridge = [argv for argv in plan.hosts[0].commands if argv[0] == "ifconfig"]
    assert bridge == [("ifconfig", "bridge0", "deletem", c.iface("studio-a", 2))]  # not en0


def test_manual_steps_rdma_off_and_the_rdma_less_port() -> None:
    c = bare(synth.cluster(3))
    c.host("studio-c").rdma = False
    c.cable("studio-a", "studio-b", a_port=c.rdma_less_port("studio-a"))
    c.cable("studio-a", "studio-c")
    c.cable("studio-b", "studio-c")
    for cable in c.cables:
        cable.a_ip = cable.b_ip = None
    plan, obj, files = set_up(c)
    assert plan.target == "jaccl"
    assert all(set(m) == MANUAL_KEYS for m in obj["manual"])
    steps = {(m["host"], m["step"].split(" ")[0]) for m in obj["manual"]}
    assert steps == {("studio-c", "Boot"), ("studio-a", "Move")}
    move = next(m["step"] for m in obj["manual"] if m["host"] == "studio-a")
    assert "studio-a port 1 (en2)" in move and "studio-a port 3" in move
    # the cable in the RDMA-less port gets no address: it has to move first
    assert {(k["a"], k["b"]) for k in obj["links"]} == {
        ("studio-a", "studio-c"),
        ("studio-b", "studio-c"),
    }
    text = setup_text(plan)
    assert "Manual steps (only a person can do these)" in text and "rdma_ctl enable" in text
    after = check(facts_of(files, c))
    assert not codes(after) & SETUP_CODES
    assert {p.code for p in after.problems if p.severity == "error"} == {
        "rdma_disabled",
        "rdma_port_unsupported",
    }


def test_nothing_to_do_on_a_ready_cluster() -> None:
    plan = plan_setup(synth.mesh(4).facts())
    assert plan.nothing_to_do and plan.target == "jaccl"
    assert "Nothing to do: the wiring is ready for jaccl." in setup_text(plan)
    assert all(not k.new for k in plan.links) and len(plan.links) == 6


def test_a_host_that_is_not_a_mac_gets_no_command() -> None:
    c = bare(synth.mesh(2))
    c.hosts.append(synth.SynthHost("linux", linux=True))
    plan, obj, _ = set_up(c)
    assert plan.target == "ring"  # a Linux host: the TCP ring only
    assert obj["hosts"][2] == {"name": "linux", "commands": []}
    assert len(obj["hosts"][0]["commands"]) == 1  # the Mac cable still gets its /30
    jaccl = plan_setup(c.facts(), "jaccl")
    assert [m.host for m in jaccl.manual] == ["linux"]  # not_a_mac: a person's call


def test_unknown_interfaces_plan_nothing_and_say_why() -> None:
    c = bare(synth.mesh(2))
    c.host("studio-b").missing = frozenset({"ifconfig.txt"})
    plan = plan_setup(c.facts())
    assert plan.commands == 0 and plan.links == ()
    assert [m.host for m in plan.manual] == ["studio-b"]
    assert "ifconfig" in plan.manual[0].step


def test_target_follows_the_cables_or_the_flag() -> None:
    assert plan_setup(bare(synth.ring(5)).facts()).target == "jaccl-ring"
    assert plan_setup(bare(synth.mesh(3)).facts(), "ring").target == "ring"
    c = synth.cluster(3)
    c.cable("studio-a", "studio-b")
    assert plan_setup(c.facts()).target == "ring"  # no ring through studio-c
    with pytest.raises(InputError, match="--backend"):
        plan_setup(c.facts(), "mpi")
    with pytest.raises(InputError, match="no hosts"):
        plan_setup(())


def test_tcp_ring_over_a_lan_only_needs_no_command() -> None:
    c = synth.cluster(3, bridge=(1,))
    plan = plan_setup(c.facts(), "ring")
    assert plan.commands == 0 and plan.links == ()  # the bridge only matters for RDMA


def test_subnet_pool_skips_whole_taken_ranges() -> None:
    pool = SubnetPool([ipaddress.IPv4Network("10.77.0.0/16"), ipaddress.IPv4Network("10.0.0.0/9")])
    first = pool.take()
    assert first == ipaddress.IPv4Network("10.128.0.0/30")
    assert pool.take() == ipaddress.IPv4Network("10.128.0.4/30")
    full = SubnetPool(
        [ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]
    )
    with pytest.raises(InputError, match="no free /30"):
        full.take()
