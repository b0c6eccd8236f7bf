"""`mlx-cluster bench`: decode speed against the number of hosts, measured beside the prediction.

Exit codes: 0 every planned run finished; 1 a run failed, or no size has a valid plan; 2 bad
input (flags, files, the model); 130 interrupted. Progress goes to stderr (one line per run),
the markdown table to stdout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from launcher.bench.machine import machine_info, machine_line
from launcher.bench.report import (
    Row,
    Skipped,
    bench_document,
    bytes_per_token,
    markdown_table,
    measure,
    run_summary,
    with_speedups,
)
from launcher.bench.runs import (
    BenchPlanner,
    BenchSettings,
    Case,
    cluster_planner,
    local_planner,
    plan_cases,
    run_calibration,
    run_case,
)
from launcher.cli.options import (
    CLUSTER,
    FILE,
    LOCAL,
    MAX_TOKENS,
    MODEL,
    Number,
    Text,
    check_hosts_source,
    draft_model_for_ranks,
    draft_model_option,
)
from launcher.ranks.supervisor import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_RANK_FAILED,
    Deadlines,
    Outcome,
)
from topology.cluster_file import BACKENDS
from topology.errors import InputError
from topology.model.spec import ModelSpec
from topology.planning.calibration import Calibration

STRATEGY_NAMES = ("tensor", "pipeline")
CALIBRATE_LARGE_BYTES = 32 << 20  # a "large" all-reduce: prefill-sized, link-bandwidth bound
SIZE_DIGITS = 4  # a host count has at most this many digits (int() of more is slow or refused)


def parse_sizes(text: str | None, max_hosts: int) -> list[int]:
    """--sizes 1,2,4; default: 1, 2, 4, ... up to the hosts available, and all of them."""
    if text is None:
        sizes = [k for k in (1, 2, 4, 8, 16) if k <= max_hosts] + [max_hosts]
        return sorted(set(sizes))
    parts = [part.strip(" ") for part in text.split(",")]  # "1, 2" is fine; "1\n" is not
    ok = all(p.isascii() and p.isdigit() and len(p) <= SIZE_DIGITS for p in parts)
    sizes = [int(p) for p in parts] if ok else []
    if not sizes or min(sizes) < 1:
        raise InputError(f"--sizes {text}: give host counts of 1 or more, e.g. --sizes 1,2,4")
    if max(sizes) > max_hosts:
        raise InputError(f"--sizes {text}: only {max_hosts} host(s) available; use at most that")
    return sorted(set(sizes))


def parse_strategies(text: str) -> list[str]:
    names = [s.strip(" ") for s in text.split(",")]
    bad = [s for s in names if s not in STRATEGY_NAMES]
    if bad or not names:
        raise InputError(f"--strategies {text}: use tensor, pipeline or tensor,pipeline")
    return list(dict.fromkeys(names))


def _check_output(path: Path | None, flag: str) -> None:
    if path is not None and not path.parent.is_dir():
        raise InputError(f"{flag} {path}: the folder {path.parent} does not exist")


def _planner(
    cluster_file: str | None,
    local: int | None,
    spec: ModelSpec,
    backend: str | None,
    context: int,
    prompt_tokens: int,
) -> BenchPlanner | int:
    """The planner for --local N or a cluster file; an exit code when hosts do not answer."""
    check_hosts_source(cluster_file, local, backend)
    if local is not None:
        from launcher.planning.cluster_plan import measured_machine

        return local_planner(measured_machine(spec), local, spec, context, prompt_tokens)
    from launcher.hosts.gather import probe_facts, read_cluster
    from launcher.hosts.reachability import refuse_unreachable

    assert cluster_file is not None
    cluster = read_cluster(cluster_file)
    if code := refuse_unreachable(cluster):
        return code
    facts = probe_facts(cluster)
    return cluster_planner(cluster, facts, spec, backend or cluster.backend, context, prompt_tokens)


def _calibrate(
    cases: Sequence[Case], model: str, spec: ModelSpec, deadlines: Deadlines
) -> tuple[Calibration | None, int]:
    """Calibrate over each runnable host count (the largest first) and save it; (calibration,
    code). A step's waits differ with the ranks (local tensor ranks on a core each against more
    ranks than cores), so each count the plan may be asked about gets its own measurement; a
    tensor case is preferred, as tensor ranks keep to their own cores (cluster/host_cores.py)."""
    from launcher.planning.calibration_store import save_calibration

    runnable = [c for c in cases if c.target is not None]
    if not runnable:
        click.echo("calibration: skipped, no size has a valid plan to run it on", err=True)
        return None, 0
    sizes = {c.hosts for c in runnable if c.hosts > 1} or {max(c.hosts for c in runnable)}
    calibration = Calibration()
    for hosts in sorted(sizes, reverse=True):
        case = min(
            (c for c in runnable if c.hosts == hosts), key=lambda c: "tensor" not in c.strategies
        )
        assert case.target is not None
        run = run_calibration(case.target, model, spec, CALIBRATE_LARGE_BYTES, deadlines)
        if run.calibration is None:
            _say_failure("calibration", run.outcome)
            return None, run.outcome.exit_code
        calibration = run.calibration.merged(calibration)  # the largest count's bandwidths
    path = save_calibration(calibration)
    for link in calibration.links:
        click.echo(
            f"calibration: all_sum over {link.ranks} ranks ({link.cost_name}): "
            f"{link.small_bytes} B in {link.small_s * 1e6:.0f} µs, "
            f"{link.large_bytes / 2**20:.0f} MiB in {link.large_s * 1e3:.1f} ms",
            err=True,
        )
    for host, gbs in calibration.host_bandwidth_gbs:
        click.echo(f"calibration: memory bandwidth of {host}: {gbs:.1f} GB/s", err=True)
    click.echo(f"calibration: saved to {path}", err=True)
    return calibration, 0


def _say_failure(what: str, outcome: Outcome) -> None:
    if outcome.interrupted:
        click.echo("mlx-cluster: interrupted; every rank was stopped", err=True)
    elif outcome.failure is not None:
        click.echo(f"mlx-cluster: error: {what}: {outcome.failure.message()}", err=True)


@click.command("bench")
@click.argument("cluster_file", required=False, metavar="[CLUSTER.yaml]", type=CLUSTER)
@click.option("--local", type=LOCAL, help="Benchmark 1..N ranks on this machine (ring, 127.0.0.1).")
@click.option("--model", type=MODEL, required=True, help="Model directory or Hugging Face repo id.")
@click.option(
    "--sizes",
    type=Text("host counts, e.g. 1,2,4", max_chars=256),
    help="Host counts to run, e.g. 1,2,4 [1, 2, 4, ... up to all hosts].",
)
@click.option(
    "--strategies",
    type=Text("tensor, pipeline or tensor,pipeline", max_chars=256),
    default="tensor,pipeline",
    show_default=True,
)
@click.option(
    "-p", "--prompt-tokens", type=Number(int, 1, MAX_TOKENS), default=256, show_default=True
)
@click.option(
    "-g",
    "--gen-tokens",
    type=Number(int, 2, MAX_TOKENS, note="latency needs two tokens"),
    default=128,
    show_default=True,
)
@click.option(
    "--trials", type=Number(int, 1, 1000), default=3, show_default=True, help="Timed runs per size."
)
@click.option("--backend", type=click.Choice(BACKENDS), help="Default: the cluster file's.")
@click.option("--json", "json_file", type=FILE, help="Write results here.")
@click.option("--plot", "plot_file", type=FILE, help="Write a PNG chart.")
@click.option(
    "--calibrate",
    is_flag=True,
    help="Measure links, a tensor and a pipeline step's cost (a mini model) and memory first; "
    "save for plans.",
)
@click.option(
    "--speculative",
    type=click.Choice(["on", "off"]),
    default="off",
    show_default=True,
    help="on: check prompt-lookup drafts in the forward, as serve and launch do by default, and "
    "report the drafted tokens accepted. off: one token per forward, the speed the plan predicts.",
)
@draft_model_option
def bench_cmd(
    cluster_file: str | None,
    local: int | None,
    model: str,
    sizes: str | None,
    strategies: str,
    prompt_tokens: int,
    gen_tokens: int,
    trials: int,
    backend: str | None,
    json_file: Path | None,
    plot_file: Path | None,
    calibrate: bool,
    speculative: str,
    draft_model: str | None,
) -> int:
    """Measure tokens/s over 1..N hosts per strategy, beside the planner's prediction."""
    strategy_list = parse_strategies(strategies)
    _check_output(json_file, "--json")
    _check_output(plot_file, "--plot")
    if plot_file is not None:
        from launcher.bench.plot import require_matplotlib

        require_matplotlib()
    from launcher.planning.calibration_store import calibration_path, load_calibration
    from launcher.planning.model_source import load_model_spec
    from launcher.ranks.target import model_for_ranks

    check_hosts_source(cluster_file, local, backend)  # before any model lookup
    spec = load_model_spec(model)
    saved = load_calibration()  # checked now: a broken file fails before any run
    planner = _planner(
        cluster_file, local, spec, backend, prompt_tokens + gen_tokens, prompt_tokens
    )
    if isinstance(planner, int):
        return planner
    size_list = parse_sizes(sizes, planner.max_hosts)
    draft = draft_model_for_ranks(model, draft_model, speculative).get("draft_model")
    settings = BenchSettings(
        prompt_tokens, gen_tokens, trials, speculative=speculative, draft_model=draft
    )
    cases = plan_cases(planner, size_list, strategy_list)
    deadlines = Deadlines()
    model_id = model_for_ranks(model)
    calibration = saved
    if calibrate:
        fresh, code = _calibrate(cases, model_id, spec, deadlines)
        if code:
            return code
        calibration = saved.merged(fresh) if saved and fresh else fresh or saved
    rows, skipped, code = _run_all(cases, planner, model_id, spec, settings, calibration)
    if code in (EXIT_BAD_INPUT, EXIT_INTERRUPTED):
        return code
    rows = with_speedups(rows)
    machine = machine_info(planner.facts)
    click.echo(machine_line(machine))
    click.echo(markdown_table(rows, skipped))
    if json_file is not None:
        used = None if calibration is None else {
            "path": str(calibration_path()), "measured_now": calibrate, **calibration.to_json()
        }  # fmt: skip
        _write_json(json_file, bench_document(machine, model_id, settings, rows, skipped, used))
    if plot_file is not None and rows:
        from launcher.bench.plot import write_plot

        title = f"{Path(model_id).name}: decode tok/s, P={prompt_tokens} G={gen_tokens}"
        write_plot(plot_file, rows, title)
    if not rows and code == 0:
        click.echo("mlx-cluster: no size/strategy has a valid plan (see skipped)", err=True)
        return EXIT_RANK_FAILED
    return code


def _run_all(
    cases: Sequence[Case],
    planner: BenchPlanner,
    model: str,
    spec: ModelSpec,
    settings: BenchSettings,
    calibration: Calibration | None,
) -> tuple[list[Row], list[Skipped], int]:
    """Run every case with a plan, in order; the rows, the skipped ones and an exit code."""
    rows: list[Row] = []
    skipped: list[Skipped] = []
    code = 0
    runnable = [c for c in cases if c.target is not None]
    per_token = bytes_per_token(spec, settings.prompt_tokens, settings.gen_tokens)
    for c in cases:
        if c.target is None:
            skipped += [Skipped(c.hosts, s, c.reason) for s in c.strategies]
            click.echo(f"bench: skipped {c.label}: {c.reason}", err=True)
    for i, c in enumerate(runnable, 1):
        assert c.target is not None
        started = time.monotonic()
        # One line per run: begun now (a big model loads for minutes), ended with its numbers.
        click.echo(
            f"bench [{i}/{len(runnable)}] {c.label} ({c.target.backend}): ", nl=False, err=True
        )
        outcome = run_case(c.target, model, settings, Deadlines())
        if outcome.exit_code != 0 or outcome.result is None:
            click.echo("failed", err=True)
            _say_failure(f"bench {c.label}", outcome)
            if outcome.exit_code in (EXIT_BAD_INPUT, EXIT_INTERRUPTED):
                return rows, skipped, outcome.exit_code
            reason = outcome.failure.reason if outcome.failure else "no result"
            skipped += [Skipped(c.hosts, s, f"failed: {reason}") for s in c.strategies]
            code = EXIT_RANK_FAILED
            continue
        measured = measure(outcome.result)
        for s in c.strategies:
            calibrated = planner.plan(c.hosts, s, calibration) if calibration else None
            predicted_calibrated = calibrated.predicted_decode_tok_s if calibrated else None
            predicted = planner.plan(c.hosts, s, None)
            rows.append(
                Row(
                    hosts=c.hosts,
                    strategy=s,
                    backend=c.target.backend,
                    measured=measured,
                    bandwidth_gbps=round(per_token * measured.generation_tps / 1e9, 4),
                    predicted_decode_tok_s=predicted.predicted_decode_tok_s,
                    predicted_calibrated_tok_s=predicted_calibrated,
                    predicted_ttft_s=predicted.predicted_ttft_s,
                )
            )
        click.echo(run_summary(rows[-1], time.monotonic() - started), err=True)
    return rows, skipped, code


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"--json {path}: cannot write it ({e})") from None
