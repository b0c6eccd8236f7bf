"""No verdict without facts: an unreachable or unidentified host fails the check whatever the
host count, and hostile probe outputs become probe gaps, never crashes or terminal escapes."""

from __future__ import annotations

import pytest
import synth

from topology.facts import SNAPSHOT_FILES, CheckResult
from topology.host_facts import host_facts
from topology.model.spec import spec_from_config
from topology.planning.plan import plan_cluster
from topology.problems import check, unknown_hosts
from topology.report import check_json, text_report

REFUSED = "ssh failed (exit 255): ssh: connect to host 127.0.0.1 port 1: Connection refused"
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "vocab_size": 1000,
}


def unreachable(name: str) -> dict[str, str | None]:
    files: dict[str, str | None] = {}
    for f in (*SNAPSHOT_FILES, "uname.txt"):
        files[f] = None
        files[f + ".error"] = f"{REFUSED}\n"
    return files


def refused_everything(result: CheckResult) -> None:
    assert not result.ok and result.backend is None
    obj = check_json(result)
    assert obj["ok"] is False and obj["backend"] is None
    assert "NOT ready" in text_report(result) and "nothing reliable is known" in text_report(result)


@pytest.mark.parametrize("target", ["auto", "jaccl", "jaccl-ring", "ring"])
def test_one_unreachable_mac_is_not_ready(target: str) -> None:
    result = check([host_facts("gone", unreachable("gone"), {"ssh": "127.0.0.1"})], target)
    refused_everything(result)
    [p] = result.problems
    assert p.code == "probe_missing" and p.severity == "error"
    assert "Connection refused" in p.message and "ssh 127.0.0.1 true" in p.fix


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_snapshot_holding_only_sysctl_is_not_ready(n: int) -> None:
    c = synth.mesh(n)
    c.host("studio-a").missing = frozenset(set(SNAPSHOT_FILES) - {"sysctl.txt"})
    result = check(c.facts())
    refused_everything(result)
    assert unknown_hosts(result.hosts) == ("studio-a",)
    [sw] = [p for p in result.problems if "sw_vers.txt" in p.message]
    assert sw.severity == "error" and "whether it is a Mac and which macOS" in sw.fix
    assert "Run `sw_vers` on studio-a" in sw.fix


def test_unparsable_sw_vers_on_a_single_mac_is_not_ready() -> None:
    c = synth.cluster(1)
    c.host("studio-a").garbage = frozenset({"sw_vers.txt"})
    refused_everything(check(c.facts()))


def test_single_mac_missing_only_link_probes_stays_ready() -> None:
    c = synth.cluster(1)
    c.host("studio-a").missing = frozenset({"system_profiler_SPThunderboltDataType.json"})
    result = check(c.facts())
    assert result.ok and result.backend == "jaccl" and unknown_hosts(result.hosts) == ()


def test_an_unreachable_host_among_several_blocks_every_backend() -> None:
    c = synth.mesh(3)
    files = c.files()
    files["studio-b"] = unreachable("studio-b")
    facts = [host_facts(n, fs, {"ips": ["10.0.0.2"]}) for n, fs in files.items()]
    refused_everything(check(facts, "ring"))


def test_no_plan_rests_on_an_unknown_host() -> None:
    spec = spec_from_config(LLAMA)
    gone = check([host_facts("gone", unreachable("gone"))])
    plan = plan_cluster(gone, spec)
    assert not plan.ok and plan.backend is None and plan.ranks == ()
    forced = plan_cluster(gone, spec, backend="ring")
    assert not forced.ok
    healthy = plan_cluster(check(synth.cluster(1).facts()), spec)
    assert healthy.ok


HOSTILE = {
    "sysctl.txt": "hw.memsize: " + "9" * 5000 + "\nhw.model: Mac\x1b[2J\n",
    "sw_vers.txt": "ProductName: macOS\nProductVersion: 26." + "2" * 5000 + "\n",
    "ifconfig.txt": "en0: flags=8863<UP> mtu 1500\n\tinet 10.0.0.1\x1b netmask 0xffffff00\n",
    "ibv_devices.txt": "device node GUID\n rdma_en\x1b[31m 0001\n",
    "networksetup_listallhardwareports.txt": "Hardware Port: Thunderbolt 1\nDevice: en1;rm\n",
    "system_profiler_SPThunderboltDataType.json": "[" * 100_000,
    "rdma_ctl_status.txt": "enabled\udcff\n",
}


@pytest.mark.parametrize("file", sorted(HOSTILE))
def test_hostile_probe_outputs_are_gaps_with_printable_reports(file: str) -> None:
    c = synth.mesh(2)
    files = c.files()
    files["studio-a"][file] = HOSTILE[file]
    facts = [host_facts(n, fs) for n, fs in files.items()]
    [gap] = [g for g in facts[0].gaps if g.file == file]
    assert gap.reason.startswith("unparsable") and len(gap.reason) < 200
    result = check(facts)
    report = text_report(result)
    report.encode("utf-8")  # no lone surrogate: printing it cannot fail
    assert "\x1b" not in report and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in report)


def test_error_notes_from_a_snapshot_are_one_clean_line() -> None:
    c = synth.mesh(2)
    files = c.files()
    files["studio-a"]["sw_vers.txt"] = None
    files["studio-a"]["sw_vers.txt.error"] = "bad \x1b[31mred\udcff" + "x" * 5000 + "\nmore"
    [gap] = host_facts("studio-a", files["studio-a"]).gaps
    assert "\x1b" not in gap.reason and len(gap.reason) <= 300 and "more" not in gap.reason
