"""`mlx-cluster serve CLUSTER.yaml` over real ssh into emulated hosts (tests/hosts/netns.py):
when a host's rank dies or the host drops off the network mid-request, the request fails
within 10 s and serve re-plans on the hosts that remain, then answers like one mlx-lm process.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts.launching import session_pids, wait_for_ranks, wait_until_empty
from hosts.netns import EmulatedHosts, require
from serve_helpers import Server, reference, serving
from test_serve import FAIL_WITHIN_S, PROMPT, RECOVER_WITHIN_S, StreamInBackground

from cluster.tiny_model import write_tiny_model

LINUX = {"wired_limit_gb": 4}  # Linux hosts report no memory: the cluster file says it
LOAD_TIMEOUT_S = 180.0


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatedHosts]:
    require()  # skips (fails on CI) with the reason when namespaces are impossible here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with EmulatedHosts(3, topology="switch") as built:
        yield built


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 heads / 3 KV heads: tensor over 3 hosts, and over 2 too (uneven shares: 2 heads on one
    KV head and 4 on two, as the plan balances them); before uneven shares the 2 that remained
    ran a pipeline."""
    root = tmp_path_factory.mktemp("serve-hosts")
    return write_tiny_model(root / "x3", layers=6, hidden=96, heads=6, kv_heads=3)


def _start(hosts: EmulatedHosts, tmp_path: Path, model: Path) -> list[str]:
    cluster = hosts.cluster_yaml(tmp_path / "cluster.yaml", host_keys=LINUX, backend="ring")
    return [str(cluster), "--model", str(model), "--strategy", "tensor",
            "--job-option", "token_delay_s=0.1"]  # fmt: skip


@pytest.fixture
def mesh(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatedHosts]:
    """Macs as they are cabled: ssh and the launcher on the lan, ranks on /30 cables."""
    require()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with EmulatedHosts(3, topology="mesh") as built:
        yield built


def _fails_over(s: Server, fault: object) -> None:
    """A long request in flight when the fault strikes ends with an error within 10 s, and
    serving resumes on what remains."""
    s.wait_ready(LOAD_TIMEOUT_S)
    assert s.wait_health(True, 10)["ranks"] == 3
    stream = StreamInBackground(s.client(), max_tokens=2000)
    assert stream.started.wait(60), s.stderr
    assert callable(fault)
    fault()
    faulted_at = time.monotonic()
    stream.thread.join(FAIL_WITHIN_S + 5)
    assert not stream.thread.is_alive(), "the request in flight never ended"
    assert stream.error is not None and stream.ended_at - faulted_at < FAIL_WITHIN_S, s.stderr
    assert s.wait_health(True, RECOVER_WITHIN_S, every_s=0.5)["ranks"] == 2


def _request_dies_then_two_hosts_serve(s: Server, fault: object, model: Path) -> None:
    """Start a long request, apply the fault, check the failure and the recovery."""
    _fails_over(s, fault)
    body = s.health()[1]
    assert (body["strategy"], body["ranks"]) == ("tensor", 2), body
    out = s.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=16, temperature=0
    )
    assert out.choices[0].message.content == reference(model, 16, chat=PROMPT).text
    assert "re-planned tensor ×3 → tensor ×2 in" in s.stderr


def test_remote_rank_killed_fails_over_to_tensor_on_the_other_hosts(
    hosts: EmulatedHosts, model: Path, tmp_path: Path
) -> None:
    with serving(*_start(hosts, tmp_path, model)) as s:

        def kill_h1() -> None:
            os.kill(wait_for_ranks(hosts, [1], 10)[1], signal.SIGKILL)

        _request_dies_then_two_hosts_serve(s, kill_h1, model)
        assert "(h1) died" in s.stderr
        assert sorted(s.health()[1]["hosts"]) == ["h0", "h2"]
    wait_until_empty(hosts, 10, time.monotonic())


def test_host_unplugged_mid_request_fails_over_to_the_hosts_left(
    hosts: EmulatedHosts, model: Path, tmp_path: Path
) -> None:
    with serving(*_start(hosts, tmp_path, model)) as s:
        _request_dies_then_two_hosts_serve(s, lambda: hosts.set_port(2, up=False), model)
        assert "h2 stopped answering; re-planned" in s.stderr
        assert sorted(s.health()[1]["hosts"]) == ["h0", "h1"]
    # h2 is cut off: its rank cannot hear that serve is gone (runtime_protocol #13); the hosts
    # serve still reaches must be clean.
    end = time.monotonic() + 10
    while session_pids(hosts, 0) or session_pids(hosts, 1):
        assert time.monotonic() < end, "ranks left on h0/h1"
        time.sleep(0.1)


def test_remote_rank_stopped_fails_over_within_10s(
    hosts: EmulatedHosts, model: Path, tmp_path: Path
) -> None:
    with serving(*_start(hosts, tmp_path, model)) as s:
        pid = wait_for_ranks(hosts, [2], 60)[2]
        _fails_over(s, lambda: os.kill(pid, signal.SIGSTOP))
        assert "rank 2 on h2 sent nothing for" in s.stderr, s.stderr
    wait_until_empty(hosts, 20, time.monotonic())


def test_cable_cut_between_two_ranks_fails_over_naming_both_ends(
    mesh: EmulatedHosts, model: Path, tmp_path: Path
) -> None:
    with serving(*_start(mesh, tmp_path, model)) as s:
        _fails_over(s, lambda: mesh.cut_link(1, 2))
        found = re.search(r"rank \d on (h\d) lost its link to rank \d on (h\d)", s.stderr)
        assert found is not None and sorted(found.groups()) == ["h1", "h2"], s.stderr


def test_management_cut_fails_over_and_the_host_rejoins_when_it_is_back(
    mesh: EmulatedHosts, model: Path, tmp_path: Path
) -> None:
    with serving(*_start(mesh, tmp_path, model)) as s:
        _fails_over(s, lambda: mesh.set_port(2, up=False))  # h2 keeps its cables, loses the lan
        assert "h2 stopped answering; re-planned tensor ×3 → tensor ×2" in s.stderr, s.stderr
        mesh.set_port(2, up=True)
        end = time.monotonic() + RECOVER_WITHIN_S
        while "h2 is back: tensor ×2 → tensor ×3 in" not in s.stderr:
            assert time.monotonic() < end, s.stderr
            time.sleep(0.5)
        body = s.wait_health(True, 10)
        assert (body["strategy"], body["ranks"]) == ("tensor", 3), body
        out = s.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=16, temperature=0
        )
        assert out.choices[0].message.content == reference(model, 16, chat=PROMPT).text
