"""Discovery with real mDNS between network namespaces on one switch (no mocked zeroconf).

Agents run as `mlx-cluster agent` in some emulated hosts; `mlx-cluster discover` runs in another.
Every wait is bounded; every agent started here is stopped by the test (or the harness teardown).
"""

from __future__ import annotations

import http.client
import json
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import synth
import yaml
from paths import MLX_CLUSTER as CLI_PATH

from cluster.microbench import DEFAULT_KINDS
from hosts.netns import VENV_PYTHON, EmulatedHosts, require
from topology.cluster_file import parse_cluster
from topology.host_rates import parse_rates

MLX_CLUSTER = str(CLI_PATH)
TTL_S = 2  # agents' record TTL here: a crashed agent must vanish from discover within ~this
LINE_RE = re.compile(
    r"^mlx-cluster agent: (\S+) on ([\d.]+):(\d+) \(_mlx-cluster\._tcp\.local\.\)$"
)


@dataclass
class RunningAgent:
    host: int
    name: str
    ip: str
    port: int
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def lan() -> Iterator[EmulatedHosts]:
    """Hosts 0-3 run agents, host 4 browses; built once for the module (no sshd needed)."""
    require(need_sshd=False)
    with EmulatedHosts(5, topology="switch", sshd=False) as hosts:
        yield hosts


class Agents:
    def __init__(self, hosts: EmulatedHosts) -> None:
        self.hosts = hosts
        self.running: list[RunningAgent] = []

    def start(
        self,
        *indices: int,
        ttl: int = TTL_S,
        per_host: Callable[[int], list[str]] = lambda i: [],
    ) -> list[RunningAgent]:
        """Start agents on these hosts (in parallel) and wait for each one's "listening" line;
        `per_host(i)` adds options (a later --name wins over the default h<i>)."""
        procs = []
        for i in indices:
            argv = [MLX_CLUSTER, "agent", "--interface", "lan0", "--name", self.hosts[i].name]
            procs.append(
                self.hosts.popen(
                    i,
                    [*argv, "--ttl", str(ttl), *per_host(i)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        names = [self.hosts[i].name for i in indices]
        started = [
            self._ready(i, proc, name) for i, proc, name in zip(indices, procs, names, strict=True)
        ]
        self.running += started
        return started

    def _ready(self, i: int, proc: subprocess.Popen[str], name: str) -> RunningAgent:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline().strip() if ready else ""
        m = LINE_RE.match(line)
        if m is None:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"agent on host {i} did not start: {line!r} {err!r}")
        assert m.group(2) == self.hosts[i].ip
        return RunningAgent(i, m.group(1), m.group(2), int(m.group(3)), proc)

    def stop_all(self) -> None:
        for a in self.running:
            if a.proc.poll() is None:
                a.proc.kill()
            a.proc.wait(timeout=10)


@pytest.fixture
def agents(lan: EmulatedHosts) -> Iterator[Agents]:
    started = Agents(lan)
    try:
        yield started
    finally:
        started.stop_all()


def _discover(lan: EmulatedHosts, *args: str, timeout_s: float = 3) -> subprocess.Popen[str]:
    argv = [MLX_CLUSTER, "discover", "--json", "--timeout", str(timeout_s), *args]
    return lan.popen(4, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str], timeout_s: float = 30) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def _by_name(result: dict[str, Any], key: str = "agents") -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in result[key]}


def test_discover_finds_agents_with_their_facts(lan: EmulatedHosts, agents: Agents) -> None:
    a0, a1 = agents.start(0, 1)
    found = _by_name(_result(_discover(lan)))
    assert sorted(found) == ["h0", "h1"]
    for a in (a0, a1):
        entry = found[a.name]
        assert (entry["addresses"], entry["port"], entry["ssh"]) == ([a.ip], a.port, a.ip)
        # Linux namespaces: the probe records "not a Mac", and the agent says so.
        assert entry["facts"]["is_mac"] is False
        assert entry["facts"]["rdma"] == "unknown"


def test_agent_serves_only_get_on_its_interface(lan: EmulatedHosts, agents: Agents) -> None:
    (a0,) = agents.start(0)

    def request(method: str, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(a0.ip, a0.port, timeout=5)  # root ns is on the lan
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    status, body = request("GET", "/snapshot")
    snapshot = json.loads(body)
    assert status == 200 and "sw_vers.txt" in snapshot
    # Measured once at start (cluster.microbench), served as the file and among the facts.
    rates = parse_rates(snapshot["rates.json"])
    assert rates.device == "cpu" and set(rates.matmul_gflops) == set(DEFAULT_KINDS)
    status, body = request("GET", "/facts")
    host = json.loads(body)["host"]
    assert status == 200 and host["name"] == "h0"
    assert host["rates"]["copy_gbs"] == rates.copy_gbs
    assert host["rates"]["matmul_gflops"] == rates.to_json()["matmul_gflops"]
    assert request("POST", "/snapshot")[0] == 405
    assert request("DELETE", "/facts")[0] == 405
    assert request("GET", "/etc/passwd")[0] == 404
    # Bound to lan0's address only: nothing listens on the host's loopback.
    probe = f"import socket; socket.create_connection(('127.0.0.1', {a0.port}), 2)"
    done = lan.run(0, [str(VENV_PYTHON), "-c", probe], timeout=30)
    assert done.returncode != 0 and "ConnectionRefusedError" in done.stderr
    a0.proc.send_signal(signal.SIGINT)  # Ctrl-C: the same clean stop as SIGTERM
    _, err = a0.proc.communicate(timeout=15)
    assert a0.proc.returncode == 0 and err == ""


def test_stopped_agent_says_goodbye_and_crashed_one_expires(
    lan: EmulatedHosts, agents: Agents
) -> None:
    stopped, crashed, _ = agents.start(0, 1, 2)
    browsing = _discover(lan, timeout_s=10)
    time.sleep(4)  # the browse has seen all three by now (agents answer within ~1 s)
    stopped_at = time.time()
    stopped.proc.send_signal(signal.SIGTERM)
    assert stopped.proc.wait(timeout=15) == 0  # clean exit after unregistering (bound: load)
    killed_at = time.time()
    crashed.proc.kill()  # no goodbye: only the TTL can tell the browser
    crashed.proc.wait(timeout=15)
    result = _result(browsing)
    assert list(_by_name(result)) == ["h2"]
    gone = _by_name(result, "gone")
    print(json.dumps(gone, indent=1), stopped_at, killed_at)
    assert gone["h0"]["how"] == "goodbye"
    assert gone["h0"]["seen_at"] < stopped_at <= gone["h0"]["gone_at"] < stopped_at + 2.0
    assert gone["h1"]["how"] == "expired"
    # Records last refreshed before the kill expire within the TTL; then one unanswered re-ask.
    assert gone["h1"]["seen_at"] < killed_at < gone["h1"]["gone_at"] <= killed_at + TTL_S + 3.0
    assert sorted(_by_name(_result(_discover(lan)))) == ["h2"]


def test_write_cluster_file_parses(lan: EmulatedHosts, agents: Agents, tmp_path: Path) -> None:
    a0, a1 = agents.start(0, 1)
    target = tmp_path / "cluster.yaml"
    _result(_discover(lan, "--write-cluster", str(target)))
    spec = parse_cluster(target.read_text(), str(target))
    assert [(h.name, h.ssh, h.ips) for h in spec.hosts] == [
        (a.name, a.ip, (a.ip,)) for a in (a0, a1)
    ]
    before = target.read_text()
    again = _discover(lan, "--write-cluster", str(target))
    out, err = again.communicate(timeout=30)
    assert again.returncode == 2 and out == ""
    assert err.count("\n") == 1 and "already exists" in err and "Traceback" not in err
    assert target.read_text() == before


def test_same_name_twice_is_refused(lan: EmulatedHosts, agents: Agents) -> None:
    agents.start(0)
    argv = [MLX_CLUSTER, "agent", "--interface", "lan0", "--name", "h0"]
    done = lan.run(1, argv, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "already advertises the name 'h0'" in done.stderr


@pytest.fixture
def mac_agents(agents: Agents, tmp_path: Path) -> tuple[synth.Cluster, list[RunningAgent]]:
    """Hosts 0-3 serve the snapshots of a synthesized healthy 4-Mac RDMA mesh."""
    macs = synth.mesh(4)
    snapshot = macs.write(tmp_path / "mesh")
    started = agents.start(
        0, 1, 2, 3, per_host=lambda i: ["--name", macs.hosts[i].name, "--snapshot",
                                        str(snapshot / macs.hosts[i].name)]
    )  # fmt: skip
    return macs, started


def test_discover_reports_mac_facts(
    lan: EmulatedHosts, mac_agents: tuple[synth.Cluster, list[RunningAgent]]
) -> None:
    macs, started = mac_agents
    found = _by_name(_result(_discover(lan)))
    assert sorted(found) == [h.name for h in macs.hosts]
    for host, facts in zip(macs.hosts, macs.facts(), strict=True):
        entry = found[host.name]["facts"]
        assert (entry["chip"], entry["memory_bytes"], entry["macos"], entry["rdma"]) == (
            "Apple M3 Ultra",
            512 * 2**30,
            "26.2",
            "enabled",
        )
        assert entry["is_mac"] is True
        assert entry["tb_uuids"] == [p.bus_uuid for p in facts.tb_ports]
    assert [found[a.name]["addresses"] for a in started] == [[a.ip] for a in started]


def test_topology_check_and_snapshot_from_discovered_agents(
    lan: EmulatedHosts, mac_agents: tuple[synth.Cluster, list[RunningAgent]], tmp_path: Path
) -> None:
    macs, started = mac_agents
    done = lan.run(4, [MLX_CLUSTER, "topology", "check", "--discover", "--json"], timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["ok"], report["backend"]) == (True, "jaccl")
    assert [h["name"] for h in report["hosts"]] == [h.name for h in macs.hosts]
    assert len(report["links"]) == 6 and all(link["rdma"] for link in report["links"])

    out = tmp_path / "recorded"
    done = lan.run(4, [MLX_CLUSTER, "topology", "snapshot", "--discover", "--out", str(out)])
    assert done.returncode == 0, done.stderr
    for host, agent in zip(macs.hosts, started, strict=True):
        for file, text in macs.host_files(host).items():
            if text is not None:
                assert (out / host.name / file).read_text() == text
        assert yaml.safe_load((out / host.name / "host.yaml").read_text()) == {
            "ssh": agent.ip,
            "ips": [agent.ip],
        }


def test_discover_cannot_be_combined_with_a_host_list(lan: EmulatedHosts) -> None:
    argv = [MLX_CLUSTER, "topology", "check", "--discover", "--hosts", "a,b"]
    done = lan.run(4, argv, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--discover" in done.stderr


def test_topology_check_discover_without_agents_says_what_to_do(lan: EmulatedHosts) -> None:
    done = lan.run(4, [MLX_CLUSTER, "topology", "check", "--discover"], timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "run `mlx-cluster agent`" in done.stderr
