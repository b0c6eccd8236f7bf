"""`mlx-cluster topology setup`: what makes the wiring ready, printed or (`--apply`) done."""

from __future__ import annotations

import json
from pathlib import Path

import click

from launcher.cli.options import host_source_options
from launcher.discovery.cluster import discovered_cluster, refuse_other_sources
from launcher.hosts.gather import cluster_from_args, probe_facts
from launcher.hosts.reachability import refuse_unreachable
from launcher.hosts.setup_apply import apply_setup
from launcher.hosts.snapshots import load_snapshot
from topology.cluster_file import BACKENDS, ClusterSpec
from topology.errors import InputError
from topology.report import text_report
from topology.setup.plan import plan_setup
from topology.setup.report import setup_json, setup_text


def _err(line: str) -> None:
    click.echo(f"mlx-cluster: error: {line}", err=True)


@click.command("setup")
@host_source_options("Plan from a recorded snapshot.")
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    help="Target backend (default: the cluster file's; auto = the best the cables allow).",
)
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Run the commands over ssh with `sudo -n`, then check again.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the text.")
def setup_cmd(
    cluster: str | None,
    hosts: str | None,
    snapshot: Path | None,
    discover: bool,
    backend: str | None,
    do_apply: bool,
    as_json: bool,
) -> int:
    """Plan (or with --apply, make) the wiring ready: exit 0 ready, 1 steps remain, 2, 3."""
    spec: ClusterSpec | None
    if discover:
        refuse_other_sources(cluster=cluster, hosts=hosts, snapshot=snapshot)
        spec, files = discovered_cluster()
    else:
        spec, files = cluster_from_args(cluster, hosts, snapshot), None
    if do_apply and spec is None:
        raise InputError(
            "--apply changes live hosts: give CLUSTER.yaml, --hosts or --discover, not --snapshot"
        )
    if spec is not None and files is None and (code := refuse_unreachable(spec)):
        return code  # before probing: probes of a dead host only time out
    facts = probe_facts(spec, files) if spec else load_snapshot(snapshot or Path())
    env = spec.env if spec else ()
    plan = plan_setup(facts, backend or (spec.backend if spec else "auto"), env)
    if as_json:
        click.echo(json.dumps(setup_json(plan), indent=2))
    else:
        click.echo(setup_text(plan, applying=do_apply), nl=False)
    if not do_apply or spec is None:
        return 0 if plan.nothing_to_do else 1

    def progress(line: str) -> None:  # stdout holds the one JSON object with --json
        click.echo(line, err=as_json)

    progress("")
    progress("Applying" if plan.commands else "Applying: no command to run")
    applied = apply_setup(spec, plan, facts, lambda s: progress(f"  {s}"), _err)
    if applied.after is not None:
        if as_json:
            errors = [p.code for p in applied.after.problems if p.severity == "error"]
            verdict = "passes" if applied.after.ok else f"still fails ({', '.join(errors)})"
            progress(f"after setup: `topology check` for {plan.target} {verdict}")
        else:
            progress("")
            progress(text_report(applied.after).rstrip("\n"))
    return applied.exit_code
