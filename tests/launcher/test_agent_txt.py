"""The agent's mDNS TXT record: what the agent encodes, discover decodes, within DNS-SD limits."""

from __future__ import annotations

import pytest

from launcher.discovery.txt import AgentFacts, TxtError, agent_facts, decode_txt, encode_txt
from topology.facts import HostFacts, TbPort

UUIDS = tuple(f"1B2C3D4E-0000-4000-8000-{i:012X}" for i in range(12))


def _txt(facts: AgentFacts) -> dict[str, str | None]:
    return dict(encode_txt(facts))


def test_round_trip_keeps_every_fact() -> None:
    facts = AgentFacts(
        name="studio-a",
        ssh="admin@studio-a.local",
        version="0.1.0",
        chip="Apple M3 Ultra",
        memory_bytes=512 * 2**30,
        macos="26.2",
        rdma="enabled",
        is_mac=True,
        tb_uuids=UUIDS[:6],
    )
    assert decode_txt(_txt(facts)) == facts


def test_many_thunderbolt_buses_split_over_keys_within_255_bytes() -> None:
    facts = AgentFacts(name="n", ssh="10.0.0.1", version="1", tb_uuids=UUIDS)
    txt = encode_txt(facts)
    assert all(len(f"{k}={v}".encode()) <= 255 for k, v in txt.items())
    assert len([k for k in txt if k.startswith("tb")]) == 2  # 12 uuids do not fit one string
    assert decode_txt(dict(txt)).tb_uuids == UUIDS


def test_from_host_facts_uses_bus_uuids_in_port_order() -> None:
    ports = (
        TbPort(port=2, bus_uuid=UUIDS[1], connected=True, speed_gbps=80.0),
        TbPort(port=1, bus_uuid=UUIDS[0], connected=False, speed_gbps=None),
    )
    host = HostFacts(name="mini", chip="Apple M4 Pro", rdma="disabled", tb_ports=ports)
    facts = agent_facts(host, ssh="10.0.0.2", version="0.1.0")
    assert facts.tb_uuids == (UUIDS[1], UUIDS[0])
    assert decode_txt(_txt(facts)).rdma == "disabled"


def test_linux_host_says_not_a_mac() -> None:
    host = HostFacts(name="linux-box", is_mac=False)
    decoded = decode_txt(_txt(agent_facts(host, ssh="10.0.0.3", version="0.1.0")))
    assert (decoded.is_mac, decoded.chip, decoded.rdma, decoded.tb_uuids) == (
        False,
        None,
        "unknown",
        (),
    )


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("proto", "2", "protocol"),
        ("name", "a;touch /tmp/x", "host name"),
        ("name", "$(reboot)", "host name"),
        ("name", "x" * 64, "host name"),
        ("ssh", "`id`@host", "ssh destination"),
        ("ssh", "host -oProxyCommand=x", "ssh destination"),
        ("ssh", "-oProxy@host", "ssh destination"),
    ],
)
def test_hostile_or_foreign_advertisements_are_refused(key: str, value: str, says: str) -> None:
    txt = _txt(AgentFacts(name="ok", ssh="10.0.0.1", version="1"))
    txt[key] = value
    with pytest.raises(TxtError, match=says):
        decode_txt(txt)


def test_garbage_values_become_unknown_not_errors() -> None:
    txt = _txt(AgentFacts(name="ok", ssh="10.0.0.1", version="1"))
    txt.update(mem="lots", rdma="maybe", chip="\x1b[31mred", macos=None, tb="zz;rm,1B2C-00")
    facts = decode_txt(txt)
    assert (facts.memory_bytes, facts.rdma, facts.chip, facts.macos) == (
        None,
        "unknown",
        None,
        None,
    )
    assert facts.tb_uuids == ("1B2C-00",)
