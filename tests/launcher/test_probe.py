"""Probing for real: this Linux box (no macOS commands here) and an ssh that cannot connect."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from cluster.microbench import DEFAULT_KINDS
from launcher.hosts.probe import PROBES, probe_hosts, probe_local
from launcher.hosts.ssh import ssh_argv
from topology.cluster_file import hosts_from_list, parse_cluster
from topology.facts import RATES_FILE
from topology.host_facts import host_facts
from topology.problems import check


def test_local_probe_on_linux_records_failures_and_is_not_a_mac() -> None:
    files = probe_local(timeout_s=20)
    assert files["uname.txt"] == "Linux\n"
    for f in ("sw_vers.txt", "system_profiler_SPThunderboltDataType.json", "rdma_ctl_status.txt"):
        assert files[f] is None
        error = files[f + ".error"] or ""
        assert "exit 127" in error and "not found" in error, error
    facts = host_facts("localhost", files)
    assert facts.is_mac is False
    result = check([facts])
    assert [p.code for p in result.problems if p.severity == "error"] == ["not_a_mac"]


def test_probe_hosts_localhost_runs_here() -> None:
    spec = hosts_from_list("localhost")
    files = probe_hosts(spec, timeout_s=20)
    assert list(files) == ["localhost"]
    assert set(PROBES) <= set(files["localhost"])


def test_unreachable_ssh_host_fails_fast_with_one_reason() -> None:
    # Real ssh to a closed port: exit 255 on the first command, the rest are not attempted.
    spec = parse_cluster(
        "hosts: [{name: gone, ssh: 127.0.0.1}]\n"
        "ssh_options: ['-p', '1', '-o', 'ConnectTimeout=3']\n"
    )
    files = probe_hosts(spec, timeout_s=20)["gone"]
    assert all(files[f] is None for f in (*PROBES, RATES_FILE))
    errors = {files[f + ".error"] for f in (*PROBES, RATES_FILE)}
    assert len(errors) == 1
    error = errors.pop() or ""
    assert error.startswith("ssh failed (exit 255)") and "127.0.0.1" in error
    result = check([host_facts("gone", files, {"ssh": "127.0.0.1"})], "ring")
    [p] = [p for p in result.problems if p.code == "probe_missing"]
    assert "Connection refused" in p.message and "ssh 127.0.0.1 true" in p.fix


def test_ssh_argv_batch_mode_timeout_options_and_quoting() -> None:
    spec = parse_cluster("hosts: [{name: a, ssh: me@a.local}]\nssh_options: ['-i', '/k/id']\n")
    argv = ssh_argv(spec, spec.hosts[0], ["echo", "a b", "$(touch /tmp/x)"])
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    assert argv[5:9] == ["-i", "/k/id", "--", "me@a.local"]
    assert shlex.split(argv[9]) == ["echo", "a b", "$(touch /tmp/x)"]  # one word each, remotely
    spec2 = parse_cluster("hosts: [a]\nssh_options: ['-o', 'ConnectTimeout=2']\n")
    argv3 = ssh_argv(spec, spec.hosts[0], ["~/venv/bin/python", "~x", "$(touch /tmp/x)"])
    # what the remote shell (sshd runs it with `sh -c`) makes of it: only a leading ~/ expands
    words = subprocess.run(
        ["sh", "-c", f"printf '%s\\n' {argv3[9]}"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert words == [f"{Path.home()}/venv/bin/python", "~x", "$(touch /tmp/x)"]
    argv2 = ssh_argv(spec2, spec2.hosts[0], ["true"])
    assert argv2.count("ConnectTimeout=2") == 1 and "ConnectTimeout=5" not in argv2


def test_probe_records_versions_and_rates_with_the_configured_python() -> None:
    import sys
    from importlib.metadata import version

    files = probe_local(timeout_s=20)  # localhost: the launcher's own interpreter runs the ranks
    lines = dict(line.split(" ", 1) for line in (files["versions.txt"] or "").splitlines())
    assert lines["python"] == ".".join(map(str, sys.version_info[:3]))
    assert lines["mlx"] == version("mlx") and lines["mlx-cluster"] == version("mlx-cluster")
    assert lines["mlx-lm"] == version("mlx-lm")
    facts = host_facts("localhost", files)
    assert facts.software is not None and facts.software.version("mlx") == version("mlx")
    gone = probe_local(timeout_s=20, python="/no/such/python3")
    assert gone["versions.txt"] is None and "exit 127" in (gone["versions.txt.error"] or "")
    missing = host_facts("localhost", gone)
    assert missing.software is not None and missing.software.error is not None
    # rates.json: that python's microbenchmark; failed, it is noted and no problem of its own
    assert facts.rates is not None and facts.rates.device == "cpu"
    assert set(facts.rates.matmul_gflops) == set(DEFAULT_KINDS)
    assert gone[RATES_FILE] is None and "exit 127" in (gone[RATES_FILE + ".error"] or "")
    assert "cluster.microbench" in (gone[RATES_FILE + ".error"] or "")
    assert missing.rates is None and all(g.file != RATES_FILE for g in missing.gaps)
    [p] = [p for p in check([missing]).problems if p.code == "software_missing"]
    assert "/no/such/python3" in p.message and p.severity == "error"
