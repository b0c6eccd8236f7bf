"""`mlx-cluster discover`: list the agents on the network; optionally write a cluster file."""

from __future__ import annotations

import json
from pathlib import Path

import click

from launcher.cli.options import FILE, Number
from launcher.discovery.browse import Discovery, FoundAgent
from launcher.discovery.cluster import DEFAULT_TIMEOUT_S, browse, cluster_yaml
from topology.errors import InputError


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.0f} GB"


def _table(found: Discovery) -> str:
    rows = [("NAME", "ADDRESSES", "PORT", "CHIP", "MEMORY", "MACOS", "RDMA", "TB BUSES", "SSH")]
    for a in found.agents:
        f = a.facts
        chip = f.chip or ("not a Mac" if not f.is_mac else "?")
        rows.append(
            (a.name, ",".join(a.addresses), str(a.port), chip, _gb(f.memory_bytes),
             f.macos or "?", f.rdma, str(len(f.tb_uuids)), f.ssh)
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [f"{g.name}: left during discovery ({g.how})" for g in found.gone]
    return "\n".join(lines)


def _check_target(path: Path) -> None:
    """Refuse before browsing: never overwrite a file the user may have edited."""
    if path.exists():
        raise InputError(f"--write-cluster {path}: already exists; remove it or pick a new path")
    if not path.parent.is_dir():
        raise InputError(f"--write-cluster {path}: directory {path.parent} does not exist")


def _write(path: Path, agents: tuple[FoundAgent, ...]) -> None:
    text = cluster_yaml(agents, str(path))
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        raise InputError(f"--write-cluster {path}: cannot write it ({e.strerror})") from None


@click.command("discover")
@click.option(
    "--timeout",
    type=Number(float, 0.5, 600, note="seconds"),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to listen for agents.",
)
@click.option("--json", "as_json", is_flag=True, help='Print one JSON object {"agents": [...]}.')
@click.option(
    "--write-cluster",
    type=FILE,
    help="Write a cluster file (hosts: name, ssh, ips) for the agents found.",
)
def discover_cmd(timeout: float, as_json: bool, write_cluster: Path | None) -> int:
    """List the agents on the local network (mDNS); write a cluster file."""
    if write_cluster is not None:
        _check_target(write_cluster)
    found = browse(timeout)
    for why in found.ignored:
        click.echo(f"mlx-cluster: warning: ignoring an advertisement: {why}", err=True)
    click.echo(json.dumps(found.to_json(), indent=1) if as_json else _table(found))
    if not found.agents:
        click.echo(
            f"mlx-cluster: no agent answered within {timeout:g}s: run `mlx-cluster agent` on "
            "each Mac (same network, mDNS on UDP 5353 allowed) or raise --timeout",
            err=True,
        )
        return 1
    if write_cluster is not None:
        _write(write_cluster, found.agents)
        click.echo(f"wrote {write_cluster} ({len(found.agents)} hosts)", err=as_json)
    return 0
