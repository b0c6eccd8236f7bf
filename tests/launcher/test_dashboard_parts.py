"""The dashboard's parts without a server: the last-minute window, the charts' series, the
event log, the wiring object (addresses, versions, fixes; nothing about ssh), the metrics the
dashboard reads, and `topology check --html` — its page opened in a real headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from browser import chromium, console_errors
from paths import ROOT
from prometheus_client.parser import text_string_to_metric_families

from launcher.cli.main import main
from launcher.hosts.snapshots import load_snapshot
from launcher.serve.dashboard.events import MAX_EVENTS, EventLog
from launcher.serve.dashboard.page import _script_json, wiring_page
from launcher.serve.dashboard.series import Series
from launcher.serve.dashboard.window import Window
from launcher.serve.dashboard.wiring import wiring_json
from launcher.serve.metrics import STEP_GAP_S, ServeMetrics, endpoint_label
from topology.problems import check

NEEDS_FIXES = ROOT / "hostfiles" / "snapshots" / "mesh-4x-needs-fixes"


def test_the_window_gives_nearest_rank_percentiles_of_the_last_minute_only() -> None:
    w = Window(window_s=60)
    assert w.percentiles(now=0) == {"p50": None, "p99": None, "count": 0}
    for i in range(1, 101):  # 1..100 at t=10
        w.add(float(i), now=10)
    w.add(1000.0, now=65)
    got = w.percentiles(now=65)
    assert (got["p50"], got["p99"], got["count"]) == (51.0, 100.0, 101)
    assert w.percentiles(now=71) == {"p50": 1000.0, "p99": 1000.0, "count": 1}  # t=10 is gone


def test_the_window_forgets_old_samples_as_new_ones_come_with_no_dashboard_reading() -> None:
    w = Window(window_s=60)
    for i in range(500):  # first-token times of a server nobody watches
        w.add(float(i), now=float(i))
    assert len(w) == 61  # t = 439..499: the last minute, not all 500


def test_the_series_differences_the_counters_and_keeps_columns_aligned() -> None:
    s = Series(points=3, every_s=1.0)
    s.sample(0.0, {"generated_tokens": 0, "prompt_tokens": 0}, {"running": 0})
    s.sample(0.5, {"generated_tokens": 99, "prompt_tokens": 0}, {"running": 9})  # too soon
    s.sample(2.0, {"generated_tokens": 100, "prompt_tokens": 40}, {"running": 2, "r1": 5})
    s.sample(3.0, {"generated_tokens": 160, "prompt_tokens": 40}, {"running": 1})
    assert s.rates() == {"prompt_tps": 0.0, "generation_tps": 60.0}
    out = s.to_json(now=3.0)
    assert out["ago_s"] == [3.0, 1.0, 0.0]
    assert out["generation_tps"] == [0.0, 50.0, 60.0] and out["prompt_tps"] == [0.0, 20.0, 0.0]
    assert out["running"] == [0, 2, 1] and out["r1"] == [None, 5, None]
    s.sample(4.0, {"generated_tokens": 0, "prompt_tokens": 0}, {})  # counters restarted
    assert s.rates()["generation_tps"] == 0.0 and len(s.to_json(4.0)["r1"]) == 3


def test_the_event_log_keeps_one_entry_per_copy_the_whole_failure_and_its_bound() -> None:
    log = EventLog()
    log.add("started", "loading")
    step = {"done": 1, "total": 4, "received": 2_000_000, "expected": 8_000_000}
    log.copy_step(1, "h1", step)
    log.copy_step(1, "h1", {**step, "done": 3, "received": 6_000_000})
    items = log.to_json()["items"]
    assert [e["kind"] for e in items] == ["copy", "started"]
    assert items[0]["progress"] == 0.75 and "3/4 files, 6.0 MB of 8.0 MB" in items[0]["message"]
    log.copied(1, "h1", {"files": 4, "bytes": 8_000_000, "resumed": 0})
    log.copied(2, "h2", {"files": 0, "bytes": 0})  # copied nothing: no event
    items = log.to_json()["items"]
    assert (
        len(items) == 2
        and items[0]["message"] == "rank 1 (h1) copied 4 files (8.0 MB) of the model"
    )
    message = "rank 1 on h1 was killed by SIGKILL\n  stage: decode\n  last words: ..."
    log.failure(message)
    out = log.to_json()
    assert out["items"][0] == {**out["items"][0], "kind": "rank_lost",
                               "message": "rank 1 on h1 was killed by SIGKILL"}  # fmt: skip
    assert out["last_failure"]["message"] == message  # in full
    for i in range(MAX_EVENTS + 5):
        log.add("plan", f"plan {i}")
    items = log.to_json()["items"]
    assert len(items) == MAX_EVENTS and items[0]["message"] == f"plan {MAX_EVENTS + 4}"


def test_the_wiring_has_every_cable_with_addresses_versions_and_fixes_but_no_ssh() -> None:
    result = check(load_snapshot(NEEDS_FIXES), "jaccl")
    wiring = wiring_json(result)
    assert [h["name"] for h in wiring["hosts"]] == ["studio-a", "studio-b", "studio-c", "studio-d"]
    a = wiring["hosts"][0]
    assert a["chip"] == "Apple M3 Ultra" and a["macos_build"] and a["versions"]["mlx"]
    assert len(wiring["links"]) == len(result.links) == 5
    ab = next(k for k in wiring["links"] if {k["a"], k["b"]} == {"studio-a", "studio-b"})
    assert ab["speed_gbps"] == 80 and isinstance(ab["rdma"], bool)
    addressed = [k for k in wiring["links"] if k["a_addresses"] and k["b_addresses"]]
    assert addressed and all(re.fullmatch(r"[\d.]+/\d+", x) for x in addressed[0]["a_addresses"])
    codes = {p["code"] for p in wiring["problems"]}
    assert {"rdma_disabled", "missing_link", "slow_link"} <= codes
    assert all(p["fix"] for p in wiring["problems"])
    text = json.dumps(wiring)
    assert "studio-a.local" not in text and '"ssh"' not in text  # host.yaml's ssh destination


def test_metrics_name_the_dashboard_routes_and_read_steps_and_peak_memory() -> None:
    assert endpoint_label("/") == "/"
    assert endpoint_label("/v1/cluster/stream/") == "/v1/cluster/stream"
    assert endpoint_label("/dashboard/app.js") == "/dashboard/{file}"
    m = ServeMetrics()
    m.step_line(10.0)
    m.step_line(10.02)
    m.step_line(10.02 + STEP_GAP_S + 1)  # an idle gap: not a step
    assert m.step_window.percentiles(now=11)["count"] == 1
    m.heartbeat(1, {"event": "heartbeat", "peak_memory_bytes": 5_000_000})
    m.heartbeat(0, {"event": "heartbeat"})  # before MLX loaded: nothing
    samples = {
        (s.name, tuple(s.labels.items())): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    }
    assert samples[("mlx_cluster_rank_peak_memory_bytes", (("rank", "1"),))] == 5e6
    assert ("mlx_cluster_rank_peak_memory_bytes", (("rank", "0"),)) not in samples
    assert samples[("mlx_cluster_step_seconds", ())] == pytest.approx(0.02)
    m.ranks_down()
    assert b"rank_peak_memory_bytes{" not in m.render()


def test_script_json_cannot_close_its_script() -> None:
    text = _script_json({"name": "</script><script>alert(1)</script>"})
    assert "<" not in text and json.loads(text)["name"].startswith("</script>")
    page = wiring_page({"hosts": [], "links": [], "problems": [], "check": None}, "<b>x</b>")
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page


def test_topology_check_html_writes_one_self_contained_page_a_browser_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "wiring.html"
    assert main(["topology", "check", "--snapshot", str(NEEDS_FIXES), "--html", str(out)]) == 1
    page = out.read_text()
    assert not re.search(r'(?:src|href)="(?!data:)', page), "the page must load nothing"
    assert "studio-a.local" not in page
    assert main(["topology", "check", "--snapshot", str(NEEDS_FIXES), "--html", str(tmp_path)]) == 2
    assert "--html" in capsys.readouterr().err
    with chromium() as browser:
        browser.get(out.as_uri())
        hosts = browser.find_elements("css selector", "svg.graph .host")
        cables = browser.find_elements("css selector", "svg.graph line.cable")
        assert len(hosts) == 4 and len(cables) == 5
        assert len(browser.find_elements("css selector", "svg.graph line.cable.rdma")) == sum(
            1 for k in wiring_json(check(load_snapshot(NEEDS_FIXES), "auto"))["links"] if k["rdma"]
        )
        problems = browser.find_element("id", "problems").text
        assert "rdma_disabled" in problems and "fix:" in problems
        assert console_errors(browser) == []


@pytest.mark.parametrize("value", ["", "a\nb.html", "x\x01.html", "/no/such/dir/w.html"])
def test_a_bad_html_path_is_one_line_and_exit_2(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topology", "check", "--snapshot", str(NEEDS_FIXES), "--html", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--html" in err and "Traceback" not in err
