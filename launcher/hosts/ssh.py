"""The one place ssh command lines are built (probing now; launching ranks later).

Always an argv list: the remote command is the only string, and each of its words is quoted with
shlex.quote, so no value from a cluster file can turn into shell syntax on the remote side.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from topology.cluster_file import ClusterSpec, HostSpec

DEFAULT_CONNECT_TIMEOUT_S = 5

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
) -> list[str]:
    """`ssh` argv running `remote_argv` on `host`: never prompts, honours ~/.ssh/config.

    BatchMode comes first so nothing can turn prompting back on (ssh keeps the first value of an
    option); ConnectTimeout is ours only when the cluster's ssh_options do not set one.
    """
    options = ["-o", "BatchMode=yes"]
    if not any("connecttimeout" in o.lower() for o in spec.ssh_options):
        options += ["-o", f"ConnectTimeout={connect_timeout_s}"]
    remote = " ".join(_remote_word(word) for word in remote_argv)
    return ["ssh", *options, *spec.ssh_options, "--", host.ssh, remote]
