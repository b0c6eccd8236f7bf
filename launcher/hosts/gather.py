"""Which hosts a command is about, and their facts: a cluster file, a --hosts list, probing."""

from __future__ import annotations

from pathlib import Path

from launcher.hosts.probe import probe_hosts
from topology.cluster_file import (
    MAX_FILE_BYTES,
    ClusterSpec,
    HostSpec,
    hosts_from_list,
    parse_cluster,
)
from topology.errors import InputError
from topology.facts import HostFacts
from topology.host_facts import host_facts


def read_cluster(path: str) -> ClusterSpec:
    """The cluster file at `path`, read as bytes (at most the size limit) and checked whole."""
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # parse_cluster names the file when it is over
    except FileNotFoundError:
        raise InputError(f"{path}: no such cluster file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    return parse_cluster(data, path)


def cluster_from_args(
    cluster: str | None, hosts: str | None, snapshot: Path | None = None, *, snapshots: bool = True
) -> ClusterSpec | None:
    """The cluster to probe, or None for --snapshot; exactly one source must be given."""
    sources = [("CLUSTER.yaml", cluster), ("--hosts", hosts), ("--snapshot", snapshot)]
    given = [n for n, v in sources if v]
    if len(given) != 1:
        what = " and ".join(given) if given else "none"
        choices = (
            "CLUSTER.yaml, --hosts a,b or --snapshot DIR"
            if snapshots
            else "CLUSTER.yaml or --hosts a,b"
        )
        raise InputError(f"give exactly one of {choices} (got {what})")
    if cluster:
        return read_cluster(cluster)
    return hosts_from_list(hosts) if hosts else None


def cluster_to_probe(cluster: str | None, hosts: str | None) -> ClusterSpec:
    """CLUSTER.yaml or --hosts (for commands that probe live only)."""
    spec = cluster_from_args(cluster, hosts, snapshots=False)
    if spec is None:  # cannot happen: one of the two was given
        raise InputError("give CLUSTER.yaml or --hosts a,b")
    return spec


def settings(host: HostSpec) -> dict[str, object]:
    """What a cluster file says about a host, in host.yaml's shape (for host_facts)."""
    return {
        "ssh": host.ssh,
        "ips": list(host.ips),
        "wired_limit_gb": host.wired_limit_gb,
        "bandwidth_gbs": host.bandwidth_gbs,
    }


def probe_facts(
    spec: ClusterSpec, files: dict[str, dict[str, str | None]] | None = None
) -> tuple[HostFacts, ...]:
    files = probe_hosts(spec) if files is None else files
    return tuple(host_facts(h.name, files[h.name], settings(h)) for h in spec.hosts)
