"""`mlx-cluster agent` and `discover` refuse bad input: one line, exit 2, nothing done."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from paths import MLX_CLUSTER as CLI_PATH

MLX_CLUSTER = str(CLI_PATH)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MLX_CLUSTER, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def _refused(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("mlx-cluster: error:")
    assert says in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--name", "a b"], "--name 'a b'"),
        (["--name", "x" * 64], "at most 63"),
        (["--name", "a;reboot"], "--name"),
        (["--name", "studio.a"], "no spaces or dots"),
        (["--interface", "nosuch0"], "no such interface"),
        (["--ttl", "0"], "--ttl"),
        (["--port", "70000"], "--port"),
        (["--snapshot", "/nonexistent/studio-a"], "not a directory"),
        (["--snapshot", "/"], "holds no snapshot files"),
    ],
)
def test_agent_refuses_bad_options(args: list[str], says: str) -> None:
    _refused(_run("agent", *args), says)


def test_agent_never_runs_a_shell_value(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _refused(_run("agent", "--ssh", f"$(touch {marker})"), "--ssh")
    _refused(_run("agent", "--name", f"`touch {marker}`"), "--name")
    assert not marker.exists()


def test_agent_on_a_taken_port_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _refused(_run("agent", "--interface", "lo", "--port", str(port)), f"--port {port}")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--timeout", "0"], "--timeout"),
        (["--write-cluster", "/nonexistent/dir/cluster.yaml"], "does not exist"),
    ],
)
def test_discover_refuses_bad_options(args: list[str], says: str) -> None:
    _refused(_run("discover", *args), says)


def test_discover_never_overwrites_a_cluster_file(tmp_path: Path) -> None:
    target = tmp_path / "cluster.yaml"
    target.write_text("hosts: [a]\n")
    _refused(_run("discover", "--write-cluster", str(target)), "already exists")
    assert target.read_text() == "hosts: [a]\n"
