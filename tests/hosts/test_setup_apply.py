"""`topology setup --apply` on emulated hosts made to look like Macs to the probe.

Each host's sshd gets `SetEnv PATH=<fakes>:...`, so every command ssh runs there finds the fake
Mac commands of tests/hosts/fake_mac.py first: they print a synthesized Mac's snapshot files and
record every call. That proves setup runs exactly the commands it printed (over ssh, under
`sudo -n`), and that it refuses a host whose sudo wants a password and never touches a Linux host.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import synth
from paths import MLX_CLUSTER

from hosts import openssh
from hosts.fake_mac import NAMES
from hosts.netns import REPO, VENV_PYTHON, EmulatedHosts

CLI = MLX_CLUSTER
FAKE_MAC = Path(__file__).resolve().parent / "fake_mac.py"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SETUP_COMMANDS = ("networksetup", "ifconfig")
PROBE_CALLS = (["networksetup", "-listallhardwareports"], ["ifconfig"])

MakeHosts = Callable[..., EmulatedHosts]


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *map(str, args)], capture_output=True, text=True, timeout=240, cwd=REPO
    )


def fake(hosts: EmulatedHosts, i: int, tmp: Path, c: synth.Cluster | None, only: str = "") -> Path:
    """Host i's commands faked (all of them from c's snapshot, or just `only`); its state dir."""
    host = hosts[i]
    state, bin_dir = tmp / f"{host.name}-state", tmp / f"{host.name}-bin"
    state.mkdir()
    bin_dir.mkdir()
    if c is not None:
        for name, text in c.host_files(c.host(host.name)).items():
            if text is not None:
                (state / name).write_text(text)
    for name in [only] if only else NAMES:
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec {VENV_PYTHON} {FAKE_MAC} {state} {name} "$@"\n')
        wrapper.chmod(0o755)
    (state / "calls.jsonl").touch()
    _restart_sshd(hosts, i, f"{bin_dir}:{SYSTEM_PATH}")
    return state


def _restart_sshd(hosts: EmulatedHosts, i: int, path: str) -> None:
    """The same sshd (same host key) again, with PATH set for every session it starts."""
    host = hosts[i]
    hosts.stop_sshd(i)
    state = hosts.tmp / host.name
    config = state / "sshd_config"
    # sshd honours only the first SetEnv line: PATH joins the one the hosts already have
    lines = config.read_text().splitlines()
    given = next((ln.split()[1:] for ln in lines if ln.startswith("SetEnv ")), [])
    kept = [v for v in given if not v.startswith("PATH=")]
    lines = [ln for ln in lines if not ln.startswith("SetEnv ")]
    env = " ".join([*kept, f"PATH={path}"])
    config.write_text("\n".join([f"SetEnv {env}", *lines]) + "\n")
    with (state / "sshd.log").open("ab") as log:
        host.sshd = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, openssh.SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    openssh.wait_for_sshd(host.sshd, host.ip, state, timeout_s=15)


def calls(state: Path) -> list[list[str]]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def changes(state: Path) -> list[list[str]]:
    """The calls that change something: setup's own commands, not the probe's."""
    return [c for c in calls(state) if c[0] in SETUP_COMMANDS and c not in PROBE_CALLS]


def two_macs() -> synth.Cluster:
    """h0 and h1 cabled with no addresses yet; h0's end sits inside an active bridge0."""
    c = synth.Cluster([synth.SynthHost("h0"), synth.SynthHost("h1")])
    cable = c.cable("h0", "h1", a_ip=None, b_ip=None)
    c.host("h0").bridge = (cable.a_port,)
    return c


def printed(done: subprocess.CompletedProcess[str]) -> dict[str, list[list[str]]]:
    obj: dict[str, Any] = json.loads(done.stdout)
    return {h["name"]: [shlex.split(line) for line in h["commands"]] for h in obj["hosts"]}


def test_apply_runs_exactly_the_printed_commands_then_checks_again(
    make_hosts: MakeHosts, tmp_path: Path
) -> None:
    hosts = make_hosts(2, topology="switch")
    c = two_macs()
    states = [fake(hosts, i, tmp_path, c) for i in range(2)]
    cluster = hosts.cluster_yaml(tmp_path / "cluster.yaml")
    plan = cli("topology", "setup", cluster, "--json")
    assert plan.returncode == 1, plan.stderr  # commands to run: not ready yet
    commands = printed(plan)
    assert commands["h0"][0] == ["sudo", "ifconfig", "bridge0", "deletem", c.iface("h0", 2)]
    assert [w[:3] for w in commands["h1"]] == [["sudo", "networksetup", "-setmanual"]]
    assert all(changes(s) == [] for s in states)  # printing changed nothing
    done = cli("topology", "setup", cluster, "--apply", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert printed(done) == commands  # stdout: the one JSON object, the same plan
    assert "after setup: `topology check` for jaccl passes" in done.stderr
    for state, name in zip(states, ("h0", "h1"), strict=True):
        assert changes(state) == [argv[1:] for argv in commands[name]], name
        sudo = [call for call in calls(state) if call[0] == "sudo"]
        assert sudo == [["sudo", "-n", "true"]] + [
            ["sudo", "-n", *argv[1:]] for argv in commands[name]
        ]
    check = cli("topology", "check", cluster, "--json")
    assert check.returncode == 0, check.stdout
    again = cli("topology", "setup", cluster, "--apply")
    assert again.returncode == 0 and "Commands: none needed" in again.stdout
    assert [len(changes(s)) for s in states] == [len(commands["h0"]), len(commands["h1"])]


def test_a_host_whose_sudo_wants_a_password_is_refused_by_name(
    make_hosts: MakeHosts, tmp_path: Path
) -> None:
    hosts = make_hosts(2, topology="switch")
    c = two_macs()
    states = [fake(hosts, i, tmp_path, c) for i in range(2)]
    (states[1] / "sudo_asks").touch()
    cluster = hosts.cluster_yaml(tmp_path / "cluster.yaml")
    done = cli("topology", "setup", cluster, "--apply")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("mlx-cluster: error: h1: sudo would ask for a password")
    assert "a password is required" in line and "nothing was changed on any host" in line
    assert all(changes(s) == [] for s in states)  # not even on h0, whose sudo was fine
    assert [call for call in calls(states[0]) if call[0] == "sudo"] == [["sudo", "-n", "true"]]


def test_a_linux_host_is_never_touched(make_hosts: MakeHosts, tmp_path: Path) -> None:
    hosts = make_hosts(2, topology="switch")
    mac = synth.Cluster([synth.SynthHost("h0", bridge=(2,))])  # a bridged port: one command
    mac_state = fake(hosts, 0, tmp_path, mac)
    linux_state = fake(hosts, 1, tmp_path, None, only="sudo")  # a real Linux host, sudo recorded
    cluster = hosts.cluster_yaml(tmp_path / "cluster.yaml")
    done = cli("topology", "setup", cluster, "--backend", "jaccl", "--apply", "--json")
    assert done.returncode == 1, done.stdout + done.stderr  # not_a_mac still blocks jaccl
    obj = json.loads(done.stdout)
    assert obj["hosts"][1] == {"name": "h1", "commands": []}
    assert [m["host"] for m in obj["manual"]] == ["h1"] and "--backend ring" in obj["manual"][0][
        "step"
    ]
    assert "h1: not a Mac; setup leaves it alone" in done.stderr
    assert "still fails (not_a_mac)" in done.stderr
    assert calls(linux_state) == []  # no sudo, nothing else of ours ran there
    assert changes(mac_state) == [["ifconfig", "bridge0", "deletem", mac.iface("h0", 2)]]


def test_fake_mac_looks_like_a_mac_to_the_probe(make_hosts: MakeHosts, tmp_path: Path) -> None:
    """The harness itself: the probe over ssh reads the fake outputs (and nothing else runs)."""
    hosts = make_hosts(1, topology="switch")
    c = synth.Cluster([synth.SynthHost("h0")])
    state = fake(hosts, 0, tmp_path, c)
    done = hosts.ssh(0, "uname -s; command -v sudo")
    assert done.stdout.split() == ["Darwin", str(tmp_path / "h0-bin" / "sudo")], done.stderr
    cluster = hosts.cluster_yaml(tmp_path / "cluster.yaml")
    check = cli("topology", "check", cluster, "--json")
    report = json.loads(check.stdout)
    assert report["hosts"][0]["chip"] == "Apple M3 Ultra" and report["ok"] is True, report
    assert ["sw_vers"] in calls(state) and changes(state) == []
