"""`mlx-cluster topology check`, `topology snapshot` and (registered here) `topology setup`.

`check --html FILE` writes the dashboard's wiring view as one self-contained page
(launcher/serve/dashboard/page.py), for a cluster that is not serving yet."""

from __future__ import annotations

import json
from pathlib import Path

import click

from launcher.cli.options import (
    CLUSTER,
    CONTEXT,
    DIRECTORY,
    DISCOVER_HELP,
    FILE,
    HOSTS,
    MODEL,
    host_source_options,
)
from launcher.cli.topology_setup import setup_cmd
from launcher.discovery.cluster import discovered_cluster, refuse_other_sources
from launcher.hosts.gather import cluster_from_args, cluster_to_probe, probe_facts
from launcher.hosts.probe import probe_hosts
from launcher.hosts.snapshots import check_out_dir, load_snapshot, write_snapshot
from launcher.planning.model_source import load_model_spec
from topology.cluster_file import BACKENDS, ClusterSpec
from topology.errors import InputError
from topology.facts import CheckResult
from topology.host_facts import SSH_FAILED, host_facts
from topology.planning.plan import DEFAULT_CONTEXT, model_problems
from topology.problems import add_problems, check
from topology.report import check_json, dot, text_report


@click.group("topology")
def topology() -> None:
    """Record and check how the Macs are wired (Thunderbolt links, RDMA, macOS)."""


def _with_model(result: CheckResult, model: str, context: int) -> CheckResult:
    """Add the planner's model problems (model_does_not_fit, tp_not_divisible, ...)."""
    spec = load_model_spec(model)
    return add_problems(result, model_problems(result, spec, context))


def _write(flag: str, path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot write it ({e.strerror})") from None


def _wiring_html(result: CheckResult) -> str:
    from launcher.serve.dashboard.page import wiring_page
    from launcher.serve.dashboard.wiring import wiring_json

    names = ", ".join(h.name for h in result.hosts)
    return wiring_page(wiring_json(result), f"topology check: {names}")


@topology.command("check")
@host_source_options("Check a recorded snapshot.")
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    help="Target backend (default: the cluster file's, else auto = jaccl).",
)
@click.option(
    "--model",
    type=MODEL,
    metavar="M",
    help="Also check that this model fits and divides (dir or HF repo id).",
)
@click.option(
    "--context",
    type=CONTEXT,
    default=DEFAULT_CONTEXT,
    show_default=True,
    help="Context tokens for --model.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object instead of the report."
)
@click.option(
    "--dot",
    "dot_file",
    type=FILE,
    metavar="FILE",
    help="Write Graphviz of the wiring.",
)
@click.option(
    "--html",
    "html_file",
    type=FILE,
    metavar="FILE",
    help="Write the wiring as one self-contained HTML page (the dashboard's view).",
)
def check_cmd(
    cluster: str | None,
    hosts: str | None,
    snapshot: Path | None,
    discover: bool,
    backend: str | None,
    model: str | None,
    context: int,
    as_json: bool,
    dot_file: Path | None,
    html_file: Path | None,
) -> int:
    """Check the wiring against a backend: exit 0 ready, 1 something blocks it, 2 bad input."""
    for flag, path in (("--dot", dot_file), ("--html", html_file)):
        if path is not None and path.is_dir():  # refused before any host is probed
            raise InputError(f"{flag} {path}: is a directory; name the file to write")
    spec: ClusterSpec | None
    if discover:
        refuse_other_sources(cluster=cluster, hosts=hosts, snapshot=snapshot)
        spec, files = discovered_cluster()
    else:
        spec, files = cluster_from_args(cluster, hosts, snapshot), None
    facts = probe_facts(spec, files) if spec else load_snapshot(snapshot or Path())
    result = check(facts, backend or (spec.backend if spec else "auto"), spec.env if spec else ())
    if model:
        result = _with_model(result, model, context)
    if dot_file:
        _write("--dot", dot_file, dot(result))
    if html_file:
        _write("--html", html_file, _wiring_html(result))
    if as_json:
        click.echo(json.dumps(check_json(result), indent=2))
    else:
        click.echo(text_report(result), nl=False)
    return 0 if result.ok else 1


def _summary(name: str, files: dict[str, str | None], out: Path) -> str:
    facts = host_facts(name, files)
    if not facts.is_mac:
        failed = ", ".join(g.file for g in facts.gaps) or "none"
        return (
            f"{name}: not a Mac ({(files.get('uname.txt') or 'uname unknown').strip()}); only the "
            f"TCP ring backend can use it. Failed: {failed} (see {out / name}/*.error)"
        )
    reasons = {g.reason for g in facts.gaps}
    if len(reasons) == 1 and next(iter(reasons)).startswith(SSH_FAILED):
        return f"{name}: unreachable, nothing recorded ({reasons.pop()})"
    if facts.gaps:
        return f"{name}: {len(facts.gaps)} file(s) missing: " + "; ".join(
            f"{g.file}: {g.reason}" for g in facts.gaps
        )
    return f"{name}: all snapshot files recorded"


@topology.command("snapshot")
@click.argument("cluster", required=False, metavar="[CLUSTER.yaml]", type=CLUSTER)
@click.option(
    "--hosts",
    type=HOSTS,
    metavar="A,B",
    help="Comma-separated ssh destinations (`localhost` = here).",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=DIRECTORY,
    metavar="DIR",
    help="New directory to write.",
)
@click.option("--discover", is_flag=True, help=DISCOVER_HELP)
def snapshot_cmd(cluster: str | None, hosts: str | None, out: Path, discover: bool) -> int:
    """Record every host's command outputs into DIR (one subdirectory per host)."""
    spec: ClusterSpec | None
    if discover:
        refuse_other_sources(cluster=cluster, hosts=hosts)
        check_out_dir(out)
        spec, files = discovered_cluster()
    else:
        spec = cluster_to_probe(cluster, hosts)
        check_out_dir(out)
        files = probe_hosts(spec)
    write_snapshot(out, files, spec.hosts)
    for h in spec.hosts:
        click.echo(_summary(h.name, files[h.name], out))
    click.echo(
        f"Snapshot written to {out}; check it with `mlx-cluster topology check --snapshot {out}`"
    )
    return 0


topology.add_command(setup_cmd)
