"""The readable report, the contract's JSON object and the Graphviz output."""

from __future__ import annotations

import json

import synth

from topology.problems import check
from topology.report import check_json, dot, text_report

HOST_KEYS = {"name", "chip", "memory_bytes", "macos", "rdma"}
LINK_KEYS = {"a", "a_port", "a_iface", "b", "b_port", "b_iface", "speed_gbps", "rdma"}
PROBLEM_KEYS = {"code", "severity", "hosts", "message", "fix"}


def broken() -> synth.Cluster:
    c = synth.mesh(3)
    c.host("studio-c").rdma = False
    c.cables.pop(0)  # studio-a <-> studio-b
    return c


def test_json_has_exactly_the_contract_fields() -> None:
    result = check(broken().facts())
    obj = json.loads(json.dumps(check_json(result)))
    assert set(obj) == {"ok", "backend", "hosts", "links", "problems"}
    assert obj["ok"] is False and obj["backend"] == "ring"
    assert all(set(h) == HOST_KEYS for h in obj["hosts"])
    assert all(set(k) == LINK_KEYS for k in obj["links"])
    assert all(set(p) == PROBLEM_KEYS for p in obj["problems"])
    a = obj["hosts"][0]
    assert a == {
        "name": "studio-a",
        "chip": "Apple M3 Ultra",
        "memory_bytes": 512 << 30,
        "macos": "26.2",
        "rdma": "enabled",
    }
    assert {p["severity"] for p in obj["problems"]} <= {"error", "warning"}
    assert obj["links"][0]["a_iface"].startswith("en") and obj["links"][0]["speed_gbps"] == 80.0


def test_text_report_matrix_problems_and_verdict() -> None:
    c = broken()
    text = text_report(check(c.facts()))
    assert "studio-a  Apple M3 Ultra  512 GB  26.2   enabled" in text
    row_a = next(line for line in text.splitlines() if line.startswith("  studio-a  ·"))
    assert row_a.split()[2] == "-"  # no cable to studio-b
    assert row_a.endswith("3→1 80")  # to studio-c, no RDMA mark: studio-c's RDMA is off
    assert "ERROR   rdma_disabled" in text and "fix: Boot studio-c into Recovery" in text
    assert text.rstrip().endswith("Best backend today: ring (TCP ring).")
    ok = text_report(check(synth.mesh(2).facts()))
    assert "2→1 80*" in ok and "Problems: none" in ok
    assert ok.rstrip().endswith("Verdict: ready for jaccl (full RDMA mesh over 2 hosts).")
    ring = text_report(check(synth.mesh(2).facts(), "ring"))
    assert "the wiring allows jaccl" in ring


def test_dot_shows_links_rdma_and_missing_cables() -> None:
    out = dot(check(broken().facts()))
    assert out.startswith("graph cluster {") and out.rstrip().endswith("}")
    assert '"studio-a" -- "studio-c"' in out and "style=dashed" in out
    assert '"studio-a" -- "studio-b" [label="missing", style=dotted, color=red];' in out
    assert "style=bold" in dot(check(synth.mesh(2).facts()))
