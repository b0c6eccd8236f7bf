"""A cluster built from discovered agents instead of a hand-written host list."""

from __future__ import annotations

import yaml

from launcher.discovery.browse import Discovery, FoundAgent, discover, fetch_snapshots
from topology.cluster_file import ClusterSpec, parse_cluster
from topology.errors import InputError

DEFAULT_TIMEOUT_S = 3.0  # agents answer a browse within ~1 s on a LAN; leave room for retries


def browse(timeout_s: float) -> Discovery:
    """`discover`, with "cannot use mDNS here" turned into one line (exit 2)."""
    try:
        return discover(timeout_s)
    except (OSError, RuntimeError) as e:
        raise InputError(f"cannot browse mDNS on this host ({e}); check the network") from None


def find_agents(timeout_s: float) -> tuple[FoundAgent, ...]:
    """The agents present now; InputError (exit 2) when there are none to build a cluster from."""
    agents = browse(timeout_s).agents
    if not agents:
        raise InputError(
            f"no mlx-cluster agent answered within {timeout_s:g}s: run `mlx-cluster agent` on "
            "each Mac (same network, mDNS on UDP 5353 allowed)"
        )
    return agents


def cluster_yaml(agents: tuple[FoundAgent, ...], source: str = "<discovered>") -> str:
    """A cluster file listing the agents (name, ssh, ips); checked by parse_cluster before use."""
    hosts = [{"name": a.name, "ssh": a.facts.ssh, "ips": list(a.addresses)} for a in agents]
    text = "# written by `mlx-cluster discover`; add python:, backend:, ... as needed\n"
    text += yaml.safe_dump({"hosts": hosts}, sort_keys=False)
    parse_cluster(text, source)  # InputError (e.g. two agents with one name) names the problem
    return text


def refuse_other_sources(**given: object) -> None:
    """--discover replaces the host list: refuse it together with another source."""
    others = [f"--{k}" if k != "cluster" else "CLUSTER.yaml" for k, v in given.items() if v]
    if others:
        raise InputError(f"--discover finds the hosts itself; drop {' and '.join(others)}")


def discovered_cluster(
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[ClusterSpec, dict[str, dict[str, str | None]]]:
    """The agents on the network as a cluster, and each one's snapshot files (as a probe gives).

    An agent whose snapshot cannot be fetched gets no files: the check reports it as a probe gap.
    """
    agents = find_agents(timeout_s)
    spec = parse_cluster(cluster_yaml(agents), "<discovered agents>")
    return spec, fetch_snapshots(agents)
