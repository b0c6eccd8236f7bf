"""Before any rank starts: can we ssh into every host? One parallel `ssh host true` each.

A launch that starts ranks on some hosts and then finds another unreachable has to tear the
started ones down again; checking first turns that into one line per unreachable host naming
ssh's own error, and nothing is started anywhere.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import click

from launcher.hosts.ssh import DEFAULT_CONNECT_TIMEOUT_S, is_local, ssh_argv
from topology.cluster_file import ClusterSpec, HostSpec

EXIT_UNREACHABLE = 3  # distinct from 1 (a rank failed) and 2 (unusable input)
CONNECT_TIMEOUT_S = DEFAULT_CONNECT_TIMEOUT_S
# A host that accepts the connection but never finishes logging in must not hang the launch.
ANSWER_TIMEOUT_S = CONNECT_TIMEOUT_S + 10


@dataclass(frozen=True)
class Unreachable:
    host: HostSpec
    error: str  # ssh's own words, one line

    def line(self) -> str:
        return (
            f"cannot reach {self.host.name} over ssh ({self.host.ssh}): {self.error} "
            f"— `ssh {self.host.ssh} true` must work without a password prompt"
        )


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _try(spec: ClusterSpec, host: HostSpec) -> Unreachable | None:
    argv = ssh_argv(spec, host, ["true"], connect_timeout_s=CONNECT_TIMEOUT_S)
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=ANSWER_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return Unreachable(host, f"no answer within {ANSWER_TIMEOUT_S} s")
    except FileNotFoundError:
        return Unreachable(host, "the `ssh` client is not installed on this machine")
    if done.returncode == 0:
        return None
    error = _last_line(done.stderr) or f"ssh exited with code {done.returncode}"
    return Unreachable(host, error)


def unreachable_hosts(spec: ClusterSpec) -> list[Unreachable]:
    """Every remote host of the cluster that `ssh host true` fails on, in cluster order."""
    remote = [h for h in spec.hosts if not is_local(h)]
    if not remote:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(remote))) as pool:
        found = pool.map(lambda h: _try(spec, h), remote)
        return [u for u in found if u is not None]


def refuse_unreachable(spec: ClusterSpec) -> int:
    """One stderr line per unreachable host and EXIT_UNREACHABLE; 0 when all answer."""
    missing = unreachable_hosts(spec)
    for u in missing:
        click.echo(f"mlx-cluster: error: {u.line()}", err=True)
    return EXIT_UNREACHABLE if missing else 0
