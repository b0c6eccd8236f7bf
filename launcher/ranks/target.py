"""Where a launch runs: the plan, the mlx.launch hostfile, and the command for each rank.

Three sources: `--local N` (N ranks here over ring on 127.0.0.1), `--plan DIR` (plan.json +
hostfile.json from `mlx-cluster plan --out DIR`), or a cluster file (probed, checked and planned
now). Remote ranks run `python -m cluster.rank` through launcher/hosts/ssh.py's ssh_argv.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.job import RankJob
from launcher.cli.options import check_local
from launcher.ranks.jobs import DEFAULT_PORT, LOCAL_IP
from launcher.ranks.process import RankLaunch
from topology.cluster_file import ClusterSpec, HostSpec, cluster_from_mapping
from topology.errors import InputError
from topology.facts import CheckResult
from topology.planning.plan import Plan
from topology.untrusted import load_json

RANK_MODULE = ("-m", "cluster.rank")
CLUSTER_COPY = "cluster.yaml"  # the cluster file a plan was made from, next to plan.json
_MAX_PLAN_BYTES = 4 << 20  # plan.json / hostfile.json of a 64-host plan: tens of KB


@dataclass(frozen=True)
class LaunchTarget:
    plan: Plan
    hostfile: dict[str, Any]  # mlx.launch's format; rank order = list order
    cluster: ClusterSpec | None = None  # how to ssh into the hosts; None: every rank is local
    port: int | None = None  # ring/jaccl port; None: pick free ports on 127.0.0.1
    check: CheckResult | None = None  # the facts the plan was made from (serve's dashboard)

    @property
    def backend(self) -> str:
        return str(self.hostfile.get("backend") or self.plan.backend or "ring")


def model_for_ranks(model: str) -> str:
    """A local directory as an absolute path (ranks may start elsewhere); a repo id as given."""
    from launcher.planning.model_source import resolve_model

    return resolve_model(model).id


def _refuse_invalid(plan: Plan, where: str) -> None:
    if plan.ok:
        return
    first = next((p for p in plan.problems if p.severity == "error"), None)
    detail = f"{first.message} — {first.fix}" if first is not None else plan.reason
    raise PlanRefused(f"{where}: no valid plan: {detail}")


class PlanRefused(Exception):
    """The model does not fit / divide on these hosts: launch exits 1 with the reason."""


def local_target(n: int, model: str, strategy: str) -> LaunchTarget:
    from launcher.planning.cluster_plan import checked_plan_for_local
    from launcher.planning.model_source import load_model_spec

    check_local(n, None)
    result, plan, hostfile = checked_plan_for_local(
        n, load_model_spec(model), strategy=strategy, context=None
    )
    _refuse_invalid(plan, f"--local {n}")
    return LaunchTarget(plan, hostfile, check=result)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_PLAN_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path} not found: write it with `mlx-cluster plan --out DIR`") from None
    except OSError as e:
        raise InputError(
            f"{path}: cannot read it ({e.strerror}); re-run `mlx-cluster plan`"
        ) from None
    try:
        raw = load_json(data, str(path), max_bytes=_MAX_PLAN_BYTES)
    except InputError as e:
        raise InputError(f"{e}; re-run `mlx-cluster plan`") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object; re-run `mlx-cluster plan --out DIR`")
    return raw


def plan_dir_target(directory: str, model: str | None) -> LaunchTarget:
    d = Path(directory)
    if not d.is_dir():
        raise InputError(
            f"--plan {directory}: not a directory (make one with `mlx-cluster plan --out`)"
        )
    raw, hostfile = _read_json(d / "plan.json"), _read_json(d / "hostfile.json")
    try:
        plan = Plan.from_json(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(
            f"{d / 'plan.json'}: not a plan ({e}); re-run `mlx-cluster plan`"
        ) from None
    if model is not None and model_for_ranks(model) != model_for_ranks(plan.model):
        raise InputError(
            f"--plan {directory} was made for {plan.model!r}, not {model!r}: "
            "re-run `mlx-cluster plan` with this --model"
        )
    _refuse_invalid(plan, f"--plan {directory}")
    hosts = hostfile.get("hosts")
    if not isinstance(hosts, list) or len(hosts) != len(plan.ranks):
        raise InputError(
            f"{d / 'hostfile.json'}: does not match plan.json's {len(plan.ranks)} ranks"
        )
    _check_hostfile(d / "hostfile.json", hostfile, hosts)
    if plan.local:
        return LaunchTarget(plan, hostfile)
    return LaunchTarget(plan, hostfile, _plan_cluster(d, plan, hosts), port=DEFAULT_PORT)


_RDMA_DEVICE = re.compile(r"rdma_[A-Za-z0-9_.-]{1,32}")


def _check_hostfile(path: Path, hostfile: dict[str, Any], hosts: list[Any]) -> None:
    """hostfile.json's values reach rank environments and addresses: check them like a cluster
    file's (ssh, ips, envs), and its RDMA matrix as device names."""
    if hostfile.get("backend") not in (None, "ring", "jaccl", "jaccl-ring"):
        raise InputError(f"{path}: backend: must be ring, jaccl or jaccl-ring")
    if not all(isinstance(h, dict) for h in hosts):
        raise InputError(f"{path}: every entry of hosts must be an object")
    entries = [
        {"name": f"rank{i}", "ssh": h.get("ssh") or "localhost", "ips": h.get("ips") or []}
        for i, h in enumerate(hosts)
    ]
    cluster_from_mapping({"hosts": entries, "env": hostfile.get("envs", [])}, str(path))
    for i, h in enumerate(hosts):
        row = h.get("rdma")
        if row is not None and not (
            isinstance(row, list)
            and len(row) in (0, len(hosts))  # [] when the backend uses no RDMA
            and all(_rdma_cell(v) for v in row)
        ):
            raise InputError(
                f"{path}: hosts[{i}].rdma: must list {len(hosts)} rdma_enX devices or null"
            )


def _rdma_cell(v: Any) -> bool:
    """null, one device, or the devices of several cables to one peer."""
    if isinstance(v, list):
        return 0 < len(v) <= 16 and all(isinstance(d, str) and _RDMA_DEVICE.fullmatch(d) for d in v)
    return v is None or (isinstance(v, str) and bool(_RDMA_DEVICE.fullmatch(v)))


def _plan_cluster(d: Path, plan: Plan, hosts: list[Any]) -> ClusterSpec:
    """How to reach a plan's hosts: DIR/cluster.yaml (ssh options, python, env) when the plan
    was made from a cluster file, else the hostfile's ssh destinations with default settings."""
    if (d / CLUSTER_COPY).is_file():
        from launcher.hosts.gather import read_cluster

        return read_cluster(str(d / CLUSTER_COPY))
    # Through the cluster-file validator: ssh destinations and addresses from a file are
    # checked like any cluster file's before they reach an ssh command line.
    if not all(isinstance(h, dict) for h in hosts):
        raise InputError(f"{d / 'hostfile.json'}: every entry of hosts must be an object")
    entries = [
        {"name": r.host, "ssh": h.get("ssh") or r.ssh, "ips": h.get("ips") or []}
        for r, h in zip(plan.ranks, hosts, strict=True)
    ]
    return cluster_from_mapping({"hosts": entries}, str(d / "hostfile.json"))


def cluster_target(
    spec: ClusterSpec, model: str, strategy: str | None, backend: str | None
) -> LaunchTarget:
    """Probe the cluster's hosts now, check the wiring and plan."""
    from launcher.planning.cluster_plan import checked_plan_for_cluster

    result, plan, hostfile = checked_plan_for_cluster(
        spec, model, strategy=strategy or spec.strategy, backend=backend or spec.backend
    )
    _refuse_invalid(plan, spec.source)
    return LaunchTarget(plan, hostfile, spec, port=DEFAULT_PORT, check=result)


def rank_host(target: LaunchTarget, rank: int) -> HostSpec | None:
    """The cluster host a rank runs on; None when it runs on this machine."""
    if target.cluster is None:
        return None
    name = target.plan.ranks[rank].host
    for h in target.cluster.hosts:
        if h.name == name:
            # mlx.launch's rule: a host named localhost or 127.0.0.1 runs here, without ssh
            return None if h.ssh in ("localhost", LOCAL_IP) else h
    raise InputError(f"rank {rank}: host {name!r} is not in {target.cluster.source}")


def rank_launches(target: LaunchTarget, jobs: list[RankJob]) -> list[RankLaunch]:
    """The command per rank: this python locally, ssh + the host's python remotely."""
    from launcher.hosts.ssh import ssh_argv

    out = []
    for job in jobs:
        host = rank_host(target, job.rank)
        if host is None or target.cluster is None:
            argv: tuple[str, ...] = (sys.executable, *RANK_MODULE)
            out.append(RankLaunch(job.rank, target.plan.ranks[job.rank].host, argv, job))
            continue
        remote = [target.cluster.python_for(host), *RANK_MODULE]
        argv = tuple(ssh_argv(target.cluster, host, remote))
        out.append(RankLaunch(job.rank, host.name, argv, job, remote=True))
    return out
