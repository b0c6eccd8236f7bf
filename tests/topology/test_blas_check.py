"""blas.txt (what BLAS a Linux host's ranks would use): parsed, reported, and the reference_blas
warning; Mac snapshots (which never have it) read and report exactly as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import synth
from paths import ROOT

from launcher.hosts.snapshots import load_snapshot, read_host_files, write_snapshot
from topology.checks.blas import parse_blas
from topology.facts import BLAS_FILE, CheckResult, HostFacts
from topology.host_facts import host_facts
from topology.parse import ParseError
from topology.problems import check
from topology.report import check_json, text_report

SNAPSHOTS = ROOT / "hostfiles" / "snapshots"
OPENBLAS = "openblas /usr/lib/x86_64-linux-gnu/libopenblas.so.0"
MAC_HOST_KEYS = {"name", "chip", "memory_bytes", "macos", "rdma"}


def as_json(result: CheckResult) -> Any:
    return json.loads(json.dumps(check_json(result)))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("reference\n", "reference"),
        ("accelerate\n", "accelerate"),
        (OPENBLAS + "\n", OPENBLAS),
        ("other /opt/intel/lib/libmkl_rt.so\n", "other /opt/intel/lib/libmkl_rt.so"),
        ("\n  reference  \n\n", "reference"),
    ],
)
def test_parse_blas(text: str, value: str) -> None:
    assert parse_blas(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "reference\nreference\n",
        "fast\n",
        "openblas\n",  # a path must follow
        "reference /usr/lib/libblas.so.3\n",  # nothing may follow
        "openblas relative/libopenblas.so.0\n",
        "openblas /usr/lib/lib openblas.so\n",
        "openblas /usr/lib/\x1b[31mlib.so\n",
        "openblas /" + "a" * 5000 + "\n",
    ],
)
def test_parse_blas_refuses_anything_else(text: str) -> None:
    with pytest.raises(ParseError):
        parse_blas(text)


def linux_facts(blas: dict[str, str | None], n: int = 2) -> tuple[HostFacts, ...]:
    """A Linux cluster whose hosts recorded these blas.txt contents (None: not recorded)."""
    c = synth.cluster(n, linux=True, prefix="box")
    files = c.files()
    return tuple(
        host_facts(h.name, {**files[h.name], BLAS_FILE: blas.get(h.name)}, c.host_yaml(h))
        for h in c.hosts
    )


def test_reference_blas_is_a_warning_per_linux_host_and_changes_no_verdict() -> None:
    before = check(linux_facts({}), "ring")
    hosts = linux_facts({"box-a": "reference\n", "box-b": OPENBLAS + "\n"})
    assert [h.blas for h in hosts] == ["reference", OPENBLAS]
    result = check(hosts, "ring")
    assert (result.ok, result.backend) == (before.ok, before.backend) == (True, "ring")
    [p] = [p for p in result.problems if p.code == "reference_blas"]
    assert p.severity == "warning" and p.hosts == ("box-a",)
    assert "k× one token" in p.message and "libopenblas0-pthread" in p.fix
    assert [q for q in result.problems if q.code != "reference_blas"] == list(before.problems)
    jaccl = check(hosts)  # every target: a warning, never an error
    assert {q.severity for q in jaccl.problems if q.code == "reference_blas"} == {"warning"}


def test_report_shows_linux_hosts_blas_and_json_adds_it() -> None:
    hosts = linux_facts({"box-a": "reference\n", "box-b": OPENBLAS + "\n"}, n=3)
    result = check(hosts, "ring")
    text = text_report(result)
    section = text.split("BLAS on Linux hosts\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section == ["  box-a  reference", f"  box-b  {OPENBLAS}"]  # box-c: not recorded
    assert "WARNING reference_blas: box-a: ranks there would use the reference BLAS" in text
    obj = as_json(result)
    assert [h.get("blas") for h in obj["hosts"]] == ["reference", OPENBLAS, None]
    assert [set(h) - MAC_HOST_KEYS for h in obj["hosts"]] == [{"blas"}, {"blas"}, set()]
    silent = text_report(check(linux_facts({}), "ring"))
    assert "BLAS" not in silent


def test_unparsable_blas_txt_is_no_blas_and_no_crash() -> None:
    [a, b] = linux_facts({"box-a": "{ garbage\n", "box-b": None})
    assert a.blas is None and b.blas is None
    assert [p.code for p in check([a, b], "ring").problems] == [
        p.code for p in check(linux_facts({}), "ring").problems
    ]


def test_mac_snapshots_read_and_report_as_before() -> None:
    for name in ("mesh-4x-m3-ultra", "mesh-4x-needs-fixes"):
        hosts = load_snapshot(SNAPSHOTS / name)
        assert all(h.blas is None for h in hosts)
        result = check(hosts)
        assert all(set(h) == MAC_HOST_KEYS for h in as_json(result)["hosts"])
        assert "BLAS" not in text_report(result)
        assert not any(p.code == "reference_blas" for p in result.problems)
    mac = synth.mesh(2)
    files = mac.files()
    files["studio-a"][BLAS_FILE] = "reference\n"  # on a Mac it means nothing: ignored
    facts = host_facts("studio-a", files["studio-a"])
    assert facts.blas is None and facts.gaps == ()


def test_blas_txt_survives_a_snapshot_round_trip(tmp_path: Path) -> None:
    c = synth.cluster(1, linux=True, prefix="box")
    files = {name: {**f, BLAS_FILE: OPENBLAS + "\n"} for name, f in c.files().items()}
    write_snapshot(tmp_path / "snap", files)
    assert read_host_files(tmp_path / "snap" / "box-a")[BLAS_FILE] == OPENBLAS + "\n"
    [h] = load_snapshot(tmp_path / "snap")
    assert h.blas == OPENBLAS
