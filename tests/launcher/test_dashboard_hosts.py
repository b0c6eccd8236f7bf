"""The dashboard of `serve CLUSTER.yaml` over real ssh into two emulated hosts (tests/hosts),
in a real headless Chromium: the wiring and the plan name both hosts, nothing about how to
reach them (ssh destinations, options, key files) leaves the server, and when h1's rank is
killed the same page shows the rank lost, the failover, the new plan, then h1 back and the
plan grown again."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, console_errors, text, wait_for
from hosts.launching import wait_for_ranks, wait_until_empty
from hosts.netns import EmulatedHosts, require
from launch_helpers import tiny_model
from serve_helpers import serving

__all__ = ["tiny_model"]  # the fixture

LINUX = {"wired_limit_gb": 4}  # Linux hosts report no memory: the cluster file says it
LOAD_TIMEOUT_S = 180.0


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatedHosts]:
    require()  # skips (fails on CI) with the reason when namespaces are impossible here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with EmulatedHosts(2, topology="switch") as built:
        yield built


def _events(page: Any, kind: str) -> list[Any]:
    return list(page.find_elements("css selector", f"#events li[data-kind={kind}]"))


def test_the_page_shows_both_hosts_and_follows_a_failover_and_the_rejoin(
    hosts: EmulatedHosts, tiny_model: Path, tmp_path: Path
) -> None:
    cluster = hosts.cluster_yaml(tmp_path / "cluster.yaml", host_keys=LINUX, backend="ring")
    with serving(str(cluster), "--model", str(tiny_model)) as s:
        s.wait_ready(LOAD_TIMEOUT_S)
        status, state = s.request("GET", "/v1/cluster/state")
        assert status == 200
        assert [h["name"] for h in state["hosts"]] == ["h0", "h1"]
        assert [r["host"] for r in state["plan"]["ranks"]] == ["h0", "h1"]
        assert state["plan"]["backend"] == "ring" and state["links"] == []
        assert {p["code"] for p in state["problems"]} == {"not_a_mac"}
        dumped = json.dumps(state)
        secrets = [*hosts.ssh_options(), *(f"root@{h.ip}" for h in hosts)]
        leaked = [o for o in secrets if o.startswith(("/", "root@")) and o in dumped]
        assert not leaked, leaked
        assert str(hosts.client_key) not in dumped and str(hosts.known_hosts) not in dumped

        with chromium() as page:
            page.get(f"http://127.0.0.1:{s.port}/")
            wait_for("ready", lambda: text(page, "status") == "ready", 30)
            table = page.find_element("css selector", "#wiring table").text
            assert "h0" in table and "h1" in table
            graph = [t.text for t in page.find_elements("css selector", "svg.graph .host text")]
            assert "h0" in graph and "h1" in graph
            assert "×2" in text(page, "plan-summary")
            assert "the wiring supports ring" in text(page, "backend-in-use")
            page.execute_script("window.__samePage = 'yes';")

            os.kill(wait_for_ranks(hosts, [1], 10)[1], signal.SIGKILL)
            for kind in ("rank_lost", "failover", "plan"):
                wait_for(f"a {kind} event", lambda k=kind: _events(page, k), 60)
            wait_for("serving ×1 on h0", lambda: "×1" in text(page, "plan-summary")
                     and text(page, "status") == "ready", 120)  # fmt: skip
            # h1 still answers ssh: serve takes it back and the plan grows again.
            for kind in ("host_back", "rejoined"):
                wait_for(f"a {kind} event", lambda k=kind: _events(page, k), 120)
            wait_for("serving ×2 again", lambda: "×2" in text(page, "plan-summary")
                     and text(page, "status") == "ready", 60)  # fmt: skip
            assert "h1 is back" in _events(page, "rejoined")[0].text
            assert page.execute_script("return window.__samePage;") == "yes"
            assert console_errors(page) == []
    wait_until_empty(hosts, 20, time.monotonic())
