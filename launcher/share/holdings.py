"""Ask every host over ssh what it holds of a Hugging Face repo (cluster/files/inventory.py).

Used when the launching host lacks some of a repo's files: a host whose Hub cache has them
serves them to the other ranks. One ssh round to every host at once, each answer read through
the parser boundary; a host that does not answer in time simply holds nothing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from cluster.files.manifest import FileEntry, Manifest
from launcher.hosts.ssh import ssh_argv
from topology.cluster_file import ClusterSpec, HostSpec
from topology.errors import InputError
from topology.untrusted import load_json

INVENTORY_TIMEOUT_S = 30.0  # a first look hashes the repo's small non-weight files
_MAX_ANSWER = 64 << 20  # a 1000-file repo's answer is ~100 KB


def _ask(
    cluster: ClusterSpec, host: HostSpec, repo: str, revision: str | None
) -> tuple[str | None, dict[str, FileEntry]]:
    argv = ssh_argv(cluster, host, [cluster.python_for(host), "-m", "cluster.files.inventory"])
    line = json.dumps({"repo": repo, "revision": revision}) + "\n"
    try:
        done = subprocess.run(
            argv, input=line.encode(), capture_output=True, timeout=INVENTORY_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, {}
    if done.returncode != 0:
        return None, {}
    try:
        lines = done.stdout.strip().splitlines()
        answer = load_json(lines[-1] if lines else b"", f"{host.name}: inventory",
                           max_bytes=_MAX_ANSWER)  # fmt: skip
        found = answer.get("revision") if isinstance(answer, dict) else None
        manifest = Manifest.from_json({"name": "answer", "files": answer.get("files")})
    except (InputError, ValueError, AttributeError):
        return None, {}
    return (found if isinstance(found, str) else None), dict(manifest.files)


def host_holdings(
    cluster: ClusterSpec, hosts: Sequence[HostSpec], repo: str, revision: str | None
) -> dict[str, tuple[str | None, dict[str, FileEntry]]]:
    """By host name: the commit its cache holds of `repo` (`revision` when given) and the
    files it has of it."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(len(hosts)) as pool:
        answers = list(pool.map(lambda h: _ask(cluster, h, repo, revision), hosts))
    return {h.name: answer for h, answer in zip(hosts, answers, strict=True)}
