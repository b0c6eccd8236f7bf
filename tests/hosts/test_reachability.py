"""launcher/hosts/reachability.py against real sshd: who answers, and ssh's reason for who
does not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from hosts.netns import EmulatedHosts
from launcher.hosts.reachability import unreachable_hosts
from topology.cluster_file import parse_cluster


def test_each_unreachable_host_is_named_with_ssh_s_reason(
    make_hosts: Callable[..., EmulatedHosts], tmp_path: Path
) -> None:
    hosts = make_hosts(4, topology="switch")
    path = hosts.cluster_yaml(tmp_path / "cluster.yaml")
    doc = yaml.safe_load(path.read_text())
    doc["hosts"][3]["ssh"] = f"ghost@{hosts[3].ip}"  # no such user there: key refused
    spec = parse_cluster(yaml.safe_dump(doc), str(path))
    first = unreachable_hosts(spec)
    assert [u.host.name for u in first] == ["h3"] and "Permission denied" in first[0].error
    hosts.stop_sshd(1)
    hosts.set_port(2, up=False)
    found = unreachable_hosts(spec)  # in parallel: one ConnectTimeout, not three
    assert [u.host.name for u in found] == ["h1", "h2", "h3"]  # cluster order
    assert "Connection refused" in found[0].error
    assert "timed out" in found[1].error or "No route to host" in found[1].error
    line = found[0].line()
    assert "h1" in line and f"root@{hosts[1].ip}" in line and "\n" not in line
