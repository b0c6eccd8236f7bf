"""`mlx-cluster plan`: where each layer goes, over which backend, and how fast it should decode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from launcher.cli.options import CLUSTER, CONTEXT, DIRECTORY, LOCAL, MODEL, TOKENS
from launcher.planning.cluster_plan import plan_for_cluster, plan_for_local, plan_for_snapshot
from launcher.planning.model_source import load_model_spec
from topology.cluster_file import BACKENDS
from topology.errors import InputError
from topology.planning.plan import DEFAULT_CONTEXT, STRATEGIES, Plan
from topology.planning.prefill import DEFAULT_PROMPT_TOKENS
from topology.planning.report import plan_text


def _sources(cluster: str | None, snapshot: Path | None, local: int | None) -> None:
    given = [n for n, v in (("CLUSTER.yaml", cluster), ("--snapshot", snapshot)) if v]
    if local is not None:
        given.append("--local")
    if len(given) != 1:
        what = " and ".join(given) if given else "none"
        raise InputError(
            f"give exactly one of CLUSTER.yaml, --snapshot DIR or --local N (got {what})"
        )


def _out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if not out.exists() and not out.parent.is_dir():
        raise InputError(f"--out {out}: its parent directory {out.parent} does not exist")


PLAN_FILES = ("plan.json", "hostfile.json", "cluster.yaml")


def _write(out: Path, plan: Plan, hostfile: dict[str, Any], cluster: str | None) -> None:
    try:
        out.mkdir(exist_ok=True)
        (out / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n")
        (out / "hostfile.json").write_text(json.dumps(hostfile, indent=2) + "\n")
        if cluster:  # `launch --plan DIR` takes ssh options and per-host python from it
            (out / "cluster.yaml").write_bytes(Path(cluster).read_bytes())
        else:  # an older plan's cluster file must not steer this one
            (out / "cluster.yaml").unlink(missing_ok=True)
    except OSError as e:
        raise InputError(f"--out {out}: cannot write the plan ({e.strerror})") from None


@click.command("plan")
@click.argument("cluster", required=False, metavar="[CLUSTER.yaml]", type=CLUSTER)
@click.option("--snapshot", type=DIRECTORY, metavar="DIR", help="Plan on a recorded snapshot.")
@click.option(
    "--local", type=LOCAL, metavar="N", help="N ranks on this machine (ring on 127.0.0.1)."
)
@click.option(
    "--model",
    type=MODEL,
    required=True,
    metavar="M",
    help="Model directory or Hugging Face repo id.",
)
@click.option(
    "--strategy", type=click.Choice(STRATEGIES), help="Default: the cluster file's, else auto."
)
@click.option(
    "--backend", type=click.Choice(BACKENDS), help="Default: the cluster file's, else auto."
)
@click.option(
    "--context",
    type=CONTEXT,
    default=DEFAULT_CONTEXT,
    show_default=True,
    help="Context tokens to reserve KV cache for.",
)
@click.option(
    "--prompt-tokens",
    type=TOKENS,
    default=DEFAULT_PROMPT_TOKENS,
    show_default=True,
    help="The prompt length that prefill tok/s and time to first token are predicted for.",
)
@click.option(
    "--out",
    type=DIRECTORY,
    metavar="DIR",
    help="Write plan.json and hostfile.json (and the cluster file) here.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object instead of the report."
)
def plan_cmd(
    cluster: str | None,
    snapshot: Path | None,
    local: int | None,
    model: str,
    strategy: str | None,
    backend: str | None,
    context: int,
    prompt_tokens: int,
    out: Path | None,
    as_json: bool,
) -> int:
    """Plan a model over the hosts: exit 0 with a plan, 1 when none is valid, 2 bad input."""
    _sources(cluster, snapshot, local)
    if local is not None and backend not in (None, "auto", "ring"):
        raise InputError(f"--local runs ranks over the ring backend on 127.0.0.1, not {backend}")
    if out is not None:
        _out_dir(out)
    if cluster:
        from launcher.hosts.gather import read_cluster

        spec = read_cluster(cluster)
        plan, hostfile = plan_for_cluster(
            spec, model, strategy=strategy or spec.strategy, backend=backend or spec.backend,
            context=context, prompt_tokens=prompt_tokens,
        )  # fmt: skip
    else:
        model_spec = load_model_spec(model)
        if local is not None:
            plan, hostfile = plan_for_local(
                local, model_spec, strategy=strategy or "auto", context=context,
                prompt_tokens=prompt_tokens,
            )  # fmt: skip
        else:
            assert snapshot is not None
            plan, hostfile = plan_for_snapshot(
                snapshot, model_spec, strategy=strategy or "auto", backend=backend or "auto",
                context=context, prompt_tokens=prompt_tokens,
            )  # fmt: skip
    if out is not None and plan.ok:
        _write(out, plan, hostfile, cluster)
    elif out is not None:  # no valid plan: leave nothing `launch --plan` could run by mistake
        for stale in PLAN_FILES:
            (out / stale).unlink(missing_ok=True)
    if as_json:
        click.echo(json.dumps(plan.to_json(), indent=2))
    else:
        click.echo(plan_text(plan), nl=False)
        if out is not None:
            click.echo(_written(out, plan))
    return 0 if plan.ok else 1


def _written(out: Path, plan: Plan) -> str:
    if not plan.ok:
        return f"Nothing written to {out}: there is no valid plan."
    return (
        f"\nWrote {out / 'plan.json'} and {out / 'hostfile.json'}. Run it with "
        f"`mlx-cluster launch --plan {out} --prompt ...` or `mlx.launch --hostfile "
        f"{out / 'hostfile.json'} -- python your_script.py`."
    )
