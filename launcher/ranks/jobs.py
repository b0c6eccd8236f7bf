"""One RankJob per rank, with the environment and files mlx.launch would give it.

The input is an mlx.launch hostfile (`{"backend", "envs", "hosts": [{"ssh", "ips", "rdma"}]}`,
rank order = list order), so `--plan DIR`'s hostfile.json and a freshly planned one go the same
way. What each backend gets mirrors mlx/_distributed_utils/launch.py (mlx 0.32):
ring → MLX_HOSTFILE = JSON list per rank of "ip:port" (one port per rank and ip, counting up);
jaccl → MLX_IBV_DEVICES = the N×N rdma matrix, MLX_JACCL_COORDINATOR = rank 0's first ip:port;
jaccl-ring → the same plus MLX_JACCL_RING=1. Every rank gets MLX_RANK.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from cluster.job import RankJob
from launcher.ranks.supervisor import Deadlines
from topology.errors import InputError
from topology.planning.hostfile import missing_devices

ORPHAN_TIMEOUT_S = 10.0  # a rank with no keep-alive from the launcher this long stops itself

DEFAULT_PORT = 32323  # mlx.launch's --starting-port
LOCAL_IP = "127.0.0.1"


@dataclass(frozen=True)
class Generation:
    """What the user asked to generate; the same on every rank."""

    prompt: str
    max_tokens: int = 100
    temp: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    use_chat_template: bool = True


def free_ports(n: int) -> list[int]:
    """N distinct ports free on 127.0.0.1 right now (held together so none repeats)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((LOCAL_IP, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def _hosts(hostfile: dict[str, Any]) -> list[dict[str, Any]]:
    hosts = hostfile.get("hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, dict) for h in hosts):
        raise InputError("hostfile: `hosts` must be a non-empty list of {ssh, ips, rdma}")
    return hosts


def _ring_files(hosts: list[dict[str, Any]], ports: Sequence[int]) -> dict[str, str]:
    if len(hosts) == 1:
        return {}
    if any(not h.get("ips") for h in hosts):
        raise InputError("hostfile: the ring backend needs `ips` for every host")
    per_rank, k = [], 0
    for h in hosts:
        addrs = []
        for ip in h["ips"]:
            addrs.append(f"{ip}:{ports[k]}")
            k += 1
        per_rank.append(addrs)
    return {"MLX_HOSTFILE": json.dumps(per_rank)}


def _ring_links(hosts: list[dict[str, Any]], ports: Sequence[int]) -> list[list[dict[str, Any]]]:
    """Heartbeats on the ring's own connections: rank r connects to rank r+1 at each of r+1's
    addresses, so r pings there (the route picks r's end of the cable) and r+1 answers on it.
    `ports`: one heartbeat port per rank, bound on every one of its addresses."""
    n = len(hosts)
    links: list[list[dict[str, Any]]] = [[] for _ in hosts]
    for r in range(n):
        right = (r + 1) % n
        if n == 2 and r == 1:
            break  # two ranks: one neighbour each way, one connection per address
        for ip in hosts[right]["ips"]:
            links[r].append(
                {"peer": right, "peer_addr": ip, "port": ports[right], "outgoing": True}
            )
            links[right].append({"peer": r, "addr": ip, "port": ports[right], "outgoing": False})
    return links


def _mesh_links(
    hosts: list[dict[str, Any]], ports: Sequence[int], ring: bool
) -> list[list[dict[str, Any]]]:
    """jaccl: every pair of ranks (jaccl-ring: ring neighbours) heartbeats between the
    addresses the hostfile gives each host; the lower rank pings."""
    n = len(hosts)
    pairs = (
        {tuple(sorted((r, (r + 1) % n))) for r in range(n)}
        if ring
        else {(a, b) for a in range(n) for b in range(a + 1, n)}
    )
    links: list[list[dict[str, Any]]] = [[] for _ in hosts]
    for a, b in sorted(pairs):
        ip = (hosts[b].get("ips") or [""])[0]
        if not ip:
            continue  # no address for the pair: the launcher's deadlines still apply
        links[a].append({"peer": b, "peer_addr": ip, "port": ports[b], "outgoing": True})
        links[b].append({"peer": a, "addr": ip, "port": ports[b], "outgoing": False})
    return links


def _jaccl_setup(
    hosts: list[dict[str, Any]], ring: bool, port: int
) -> tuple[dict[str, str], dict[str, str]]:
    n = len(hosts)
    if not hosts[0].get("ips"):
        raise InputError(
            "hostfile: rank 0 needs an ip every rank can reach (the jaccl coordinator)"
        )
    matrix: list[list[Any]] = []
    for i, h in enumerate(hosts):
        row = h.get("rdma")
        matrix.append(row if isinstance(row, list) else [])
        if not isinstance(row, list) or len(row) != n or row[i] is not None:
            raise InputError(
                f"hostfile: host {i} `rdma` must list {n} devices with null for itself"
            )
    missing = missing_devices([str(h.get("ssh")) for h in hosts], matrix, ring)
    if missing:
        host, peer = missing[0]
        raise InputError(
            f"hostfile: no RDMA device from {host} to {peer}: run `mlx-cluster topology check`"
        )
    env = {"MLX_JACCL_COORDINATOR": f"{hosts[0]['ips'][0]}:{port}"}
    if ring:
        env["MLX_JACCL_RING"] = "1"
    return env, {"MLX_IBV_DEVICES": json.dumps(matrix)}


def _env_list(items: Sequence[Any], where: str) -> dict[str, str]:
    env = {}
    for item in items:
        if not isinstance(item, str):
            raise InputError(f"{where}: {item!r} is not a NAME=value setting")
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "").isalnum():
            raise InputError(f"{where}: {item!r} is not a NAME=value setting")
        env[key] = value
    return env


def _share(
    shares: Sequence[Mapping[str, Any] | None] | None, rank: int, n: int
) -> dict[str, Any] | None:
    if not shares or n == 1:
        return None
    if len(shares) != n:
        raise InputError(f"plan: {len(shares)} tensor shares for {n} ranks (re-plan)")
    share = shares[rank]
    return dict(share) if share is not None else None


def _layout(
    shares: Sequence[Mapping[str, Any] | None] | None, n: int
) -> list[dict[str, Any]] | None:
    if not shares or n == 1 or any(s is None for s in shares):
        return None
    return [dict(s) for s in shares if s is not None]


def build_rank_jobs(
    hostfile: dict[str, Any],
    *,
    strategy: str,
    model: str,
    generation: Generation,
    layer_split: Sequence[int] | None = None,
    tensor_shares: Sequence[Mapping[str, Any] | None] | None = None,
    extra_env: Sequence[str] = (),
    port: int | None = None,
    deadlines: Deadlines | None = None,
) -> list[RankJob]:
    """A RankJob per host of the hostfile, in rank order. port=None: free local ports."""
    hosts = _hosts(hostfile)
    n = len(hosts)
    deadlines = deadlines or Deadlines()
    backend = str(hostfile.get("backend") or "ring")
    env = _env_list([*hostfile.get("envs", []), *extra_env], "env")
    files: dict[str, str] = {}
    links: list[list[dict[str, Any]]] = [[] for _ in hosts]
    if n > 1 and backend == "ring":
        count = sum(len(h.get("ips") or []) for h in hosts)
        ports = list(free_ports(count + n) if port is None else range(port, port + count + n))
        files = _ring_files(hosts, ports[:count])
        links = _ring_links(hosts, ports[count:])
    elif n > 1 and backend in ("jaccl", "jaccl-ring"):
        ports = free_ports(1 + n) if port is None else list(range(port, port + 1 + n))
        more_env, files = _jaccl_setup(hosts, backend == "jaccl-ring", ports[0])
        env.update(more_env)
        links = _mesh_links(hosts, ports[1:], ring=backend == "jaccl-ring")
    elif n > 1:
        raise InputError(f"hostfile: backend must be ring, jaccl or jaccl-ring, got {backend!r}")
    if layer_split is not None and (len(layer_split) != n or min(layer_split) < 1):
        raise InputError(
            f"plan: layer split {list(layer_split)} does not give each of {n} ranks a layer"
        )
    return [
        RankJob(
            rank=rank,
            world_size=n,
            backend=backend,
            strategy=strategy,
            model=model,
            layer_split=tuple(layer_split) if layer_split is not None else None,
            tensor_share=_share(tensor_shares, rank, n),
            tensor_layout=_layout(tensor_shares, n),
            prompt=generation.prompt,
            max_tokens=generation.max_tokens,
            temp=generation.temp,
            top_p=generation.top_p,
            seed=generation.seed,
            use_chat_template=generation.use_chat_template,
            env={**env, "MLX_RANK": str(rank)},
            files=dict(files),
            heartbeat_s=min(1.0, deadlines.rank_timeout_s / 5),
            # Later than the launcher's own silence deadline: when the launcher is alive its
            # message wins; when it is cut off, the rank still goes.
            orphan_timeout_s=max(ORPHAN_TIMEOUT_S, 2 * deadlines.rank_timeout_s),
            links=links[rank],
        )
        for rank in range(n)
    ]
