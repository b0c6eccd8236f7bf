"""The one place ssh command lines are built (probing now; launching ranks later).

Always an argv list: the remote command is the only string, and each of its words is quoted with
shlex.quote, so no value from a cluster file can turn into shell syntax on the remote side.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from topology.cluster_file import ClusterSpec, HostSpec

DEFAULT_CONNECT_TIMEOUT_S = 5
TIMED_OUT = 124  # what a command that outlived its timeout reports (as coreutils timeout)

LOCAL_HOSTS = frozenset({"localhost"})  # probed and run on this machine, without ssh


def is_local(host: HostSpec) -> bool:
    return host.ssh in LOCAL_HOSTS


def _remote_word(word: str) -> str:
    """One word for the remote shell, quoted; a leading `~/` (a per-host python in the user's
    home) stays outside the quotes so the remote shell expands it to that user's home."""
    if word.startswith("~/") and len(word) > 2:
        return "~/" + shlex.quote(word[2:])
    return shlex.quote(word)


def ssh_argv(
    spec: ClusterSpec,
    host: HostSpec,
    remote_argv: Sequence[str],
    *,
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
    over: Sequence[str] = (),  # a shared connection's options (SharedConnection.options)
) -> list[str]:
    """`ssh` argv running `remote_argv` on `host`: never prompts, honours ~/.ssh/config.

    BatchMode comes first so nothing can turn prompting back on (ssh keeps the first value of an
    option); ConnectTimeout is ours only when the cluster's ssh_options do not set one.
    """
    options = ["-o", "BatchMode=yes"]
    if not any("connecttimeout" in o.lower() for o in spec.ssh_options):
        options += ["-o", f"ConnectTimeout={connect_timeout_s}"]
    remote = " ".join(_remote_word(word) for word in remote_argv)
    return ["ssh", *options, *over, *spec.ssh_options, "--", host.ssh, remote]


@dataclass(frozen=True)
class SharedConnection:
    """How opening the shared connection went: `options` to run commands over it (empty when it
    could not be opened: each command then connects by itself), else ssh's exit code and error."""

    options: tuple[str, ...]
    code: int
    error: str


@contextlib.contextmanager
def shared_connection(
    spec: ClusterSpec, host: HostSpec, timeout_s: float
) -> Iterator[SharedConnection]:
    """One ssh connection (a control master) that a host's probe commands run over, each as a
    session of it: one key exchange and login a host instead of one a command. Closed on exit.

    The master forks into the background once logged in (-f); its stderr goes to a file, not a
    pipe the background process would hold open. Its socket is in a private folder under /tmp
    (a socket path has ~100 bytes at most; macOS's $TMPDIR alone takes half)."""
    code = -1
    folder = tempfile.mkdtemp(prefix="mlxc-", dir="/tmp" if os.path.isdir("/tmp") else None)
    control = ["-o", f"ControlPath={os.path.join(folder, 'master')}"]
    # -N: no remote command, so ssh_argv's last word (the command) is left off
    master = ssh_argv(spec, host, [], over=[*control, "-M", "-N", "-f"])[:-1]
    try:
        with open(os.path.join(folder, "stderr"), "w+b") as err:
            try:
                code = subprocess.run(
                    master, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    timeout=timeout_s,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = TIMED_OUT
            except OSError:
                code = 127
            err.seek(0)
            error = err.read(2000).decode("utf-8", "replace").strip()
        if code == 0:
            yield SharedConnection((*control, "-o", "ControlMaster=no"), 0, "")
        else:
            timed_out = f"timed out after {timeout_s:g} s" if code == TIMED_OUT else ""
            yield SharedConnection((), code, error or timed_out)
    finally:
        if code == 0:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    ["ssh", *control, "-O", "exit", "--", host.ssh],
                    stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
