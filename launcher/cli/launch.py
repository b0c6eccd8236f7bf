"""`mlx-cluster launch`: plan, start one rank per host, stream the text, print the speeds.

Exit codes: 0 done; 1 a rank failed or timed out, or no valid plan; 2 bad input (flags, files,
the model); 130 interrupted (Ctrl-C). With --json one JSON line is printed at the end instead.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, TextIO

import click

from launcher.cli.options import (
    CLUSTER,
    LOCAL,
    MODEL,
    PROMPT,
    SEED,
    TEMP,
    TOKENS,
    TOP_P,
    Text,
    check_deadlines,
    check_local,
    deadline_options,
    draft_model_for_ranks,
    draft_model_option,
    forbid_hub,
    hub_option,
    job_options,
    placement_options,
    speculative_option,
)
from launcher.hosts.gather import read_cluster
from launcher.ranks.blas import BlasSeen, blas_lines
from launcher.ranks.jobs import Generation, build_rank_jobs
from launcher.ranks.supervisor import EXIT_RANK_FAILED, Deadlines, Outcome, supervise
from launcher.ranks.target import (
    LaunchTarget,
    PlanRefused,
    cluster_target,
    local_target,
    model_for_ranks,
    plan_dir_target,
    rank_launches,
)
from launcher.share.offer import ModelShare
from topology.cluster_file import ClusterSpec
from topology.errors import InputError


@dataclass(frozen=True)
class LaunchRun:
    """A finished launch: how it ended and what it was."""

    outcome: Outcome
    target: LaunchTarget
    copied: tuple[dict[str, int], ...] = ()  # per rank: files/bytes/resumed from a peer
    blas: tuple[str | None, ...] = ()  # per rank: its `load` event's BLAS (launcher/ranks/blas.py)

    def json_line(self) -> str:
        r = self.outcome.result or {}
        hosts = [rank.host for rank in self.target.plan.ranks]
        return json.dumps(
            {
                "text": r.get("text", ""),
                "tokens": r.get("tokens", []),
                "prompt_tps": r.get("prompt_tps"),
                "generation_tps": r.get("generation_tps"),
                "peak_memory_bytes": r.get("peak_memory_bytes", []),
                "strategy": self.target.plan.strategy,
                "backend": self.target.backend,
                "ranks": len(hosts),
                "hosts": hosts,
                "prompt_tokens": r.get("prompt_tokens"),
                "generation_tokens": len(r.get("tokens", [])),
                "finish_reason": r.get("finish_reason"),
                "copied": list(self.copied),
                "blas": list(self.blas),
                **{k: r[k] for k in DRAFT_KEYS if k in r},
            }
        )


# What the rank tells of its drafts (cluster/generate.py), passed on in --json.
DRAFT_KEYS = ("drafted_tokens", "accepted_tokens", "draft_checks")


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def summary_line(result: dict[str, Any], target: LaunchTarget) -> str:
    """Prompt and generation speed and every rank's peak memory, on one line."""
    peaks = result.get("peak_memory_bytes") or []
    memory = ", ".join(f"rank {i} {_size(int(b))}" for i, b in enumerate(peaks))
    prompt_tps, generation_tps = result.get("prompt_tps", 0.0), result.get("generation_tps", 0.0)
    return (
        f"prompt: {result.get('prompt_tokens', '?')} tokens, {prompt_tps:.1f} tok/s"
        f" | generation: {len(result.get('tokens', []))} tokens, {generation_tps:.1f} tok/s"
        f" | peak memory: {memory}"
        f" | {target.plan.strategy} over {len(target.plan.ranks)} rank(s), {target.backend}"
        f"{_drafts(result)}"
    )


def _drafts(result: dict[str, Any]) -> str:
    """Tokens per forward with drafts: each check emits its accepted drafts plus one."""
    checks, accepted = result.get("draft_checks"), result.get("accepted_tokens")
    if not isinstance(checks, int) or not isinstance(accepted, int):
        return ""
    drafted = result.get("drafted_tokens", 0)
    if not checks:
        return " | speculative: nothing drafted"
    return (
        f" | speculative: {accepted}/{drafted} drafted tokens accepted, "
        f"{(accepted + checks) / checks:.2f} tokens per checking step"
    )


class _LoadingDisplay:
    """Loading progress on a terminal's stderr, rewritten in place; silent otherwise."""

    def __init__(self, stream: TextIO, ranks: int) -> None:
        self.stream, self.active = stream, stream.isatty()
        self.done: dict[int, str] = {r: "starting" for r in range(ranks)}
        self.first: dict[int, tuple[float, int]] = {}  # rank -> when its copy started, bytes

    def _copying(self, rank: int, event: dict[str, Any]) -> str:
        """`downloading k/n`, with bytes, rate and time left when the rank says them."""
        total = event.get("total") or 0
        line = f"downloading {event.get('done', 0)}/{total}" if total else "downloading"
        received, expected = event.get("received"), event.get("expected")
        if not (isinstance(received, int) and isinstance(expected, int) and expected > 0):
            return line
        now = time.monotonic()
        since, start = self.first.setdefault(rank, (now, received))
        line += f" {_size(received)}/{_size(expected)}"
        if now - since >= 1 and received > start:
            rate = (received - start) / (now - since)
            line += f" {_size(int(rate))}/s, {max(0, expected - received) / rate:.0f} s left"
        return line

    def __call__(self, rank: int, event: dict[str, Any]) -> None:
        if not self.active:
            return
        name = event.get("event")
        if name == "loading":
            self.done[rank] = f"{event.get('layers_done', '?')}/{event.get('layers_total', '?')}"
        elif name == "progress" and event.get("stage") == "download":  # cluster/files/hub_fetch.py
            self.done[rank] = self._copying(rank, event)
        elif name in ("init", "load", "decode"):
            self.done[rank] = {"init": "connecting", "load": "loading", "decode": "ready"}[name]
        else:
            return
        states = "  ".join(f"rank {r}: {s}" for r, s in sorted(self.done.items()))
        end = "\n" if all(s == "ready" for s in self.done.values()) else ""
        self.stream.write(f"\r\033[K{states}{end}")
        self.stream.flush()
        if end:
            self.active = False


class _PromptProgress:
    """Rank 0's prompt processing on stderr, once a prompt takes more than one prefill step
    (cluster/generate.py reports each): a line per step, rewritten in place on a terminal.
    stdout (the generated text) is untouched."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.tty = stream, stream.isatty()

    def __call__(self, rank: int, event: dict[str, Any]) -> None:
        if rank != 0 or event.get("event") != "progress" or event.get("stage") != "prompt":
            return
        done, total, chunk = event.get("done"), event.get("total"), event.get("chunk")
        if not (isinstance(done, int) and isinstance(total, int) and isinstance(chunk, int)):
            return
        # mlx-lm prefills all but the last token in steps of `chunk`, then reports `total` at
        # the first token; the step ending at total - 1 is that moment too.
        if total - 1 <= chunk or done <= 0 or done == total - 1:
            return
        line = f"prompt: {done}/{total} tokens"
        if self.tty:
            self.stream.write(f"\r\033[K{line}" + ("\n" if done >= total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def run_launch(
    target: LaunchTarget,
    model: str,
    generation: Generation,
    deadlines: Deadlines,
    text_out: TextIO | None,
    options: dict[str, Any] | None = None,
    hub: bool = True,
) -> LaunchRun:
    """Start every rank of the target, stream rank 0's text to text_out, wait for the end.
    Ranks on other hosts get the model's files they lack from this host (launcher/share/)."""
    jobs = build_rank_jobs(
        target.hostfile,
        strategy=target.plan.strategy,
        model=model,
        generation=generation,
        layer_split=target.plan.layer_split,
        tensor_shares=[r.tensor_share for r in target.plan.ranks],
        port=target.port,
        deadlines=deadlines,
    )
    if options:
        jobs = [replace(j, options=dict(options)) for j in jobs]

    open_line = False  # streamed text not yet ended by a newline

    def write(text: str) -> None:
        nonlocal open_line
        if text_out is not None:
            text_out.write(text)
            text_out.flush()
            open_line = not text.endswith("\n")

    loading = _LoadingDisplay(sys.stderr, len(jobs))
    prompt = _PromptProgress(sys.stderr)
    copied = [{"files": 0, "bytes": 0, "resumed": 0} for _ in jobs]
    blas = BlasSeen(len(jobs))

    def on_event(rank: int, event: dict[str, Any]) -> None:
        loading(rank, event)
        blas(rank, event)
        prompt(rank, event)
        if event.get("event") == "decode" and isinstance(event.get("copied"), dict):
            copied[rank] = {k: int(event["copied"].get(k) or 0) for k in copied[rank]}
            if copied[rank]["files"]:
                _say_copied(rank, target.plan.ranks[rank].host, copied[rank])

    with ModelShare(model, hub) as share:
        launches = rank_launches(target, share.jobs(target, jobs))
        outcome = supervise(launches, write, on_event, deadlines)
    if open_line and text_out is not None:
        text_out.write("\n")
        text_out.flush()
    return LaunchRun(outcome, target, tuple(copied), tuple(blas.values))


def _say_copied(rank: int, host: str, copied: dict[str, int]) -> None:
    """One stderr line per rank that copied model files from this host."""
    resumed = f", resumed after {_size(copied['resumed'])}" if copied["resumed"] else ""
    files = f"{copied['files']} file{'s' * (copied['files'] != 1)}"
    sys.stderr.write(
        f"mlx-cluster: rank {rank} ({host}) copied {files} ({_size(copied['bytes'])}) "
        f"of the model from this host{resumed}\n"
    )
    sys.stderr.flush()


def resolve_target(
    cluster: ClusterSpec | None,
    local: int | None,
    plan_dir: str | None,
    model: str | None,
    strategy: str | None,
    backend: str | None,
) -> LaunchTarget:
    """Where the ranks run; the caller has checked that exactly one source was given."""
    if plan_dir is not None:
        if strategy or backend:
            raise InputError("--plan DIR already fixes strategy and backend; drop them or re-plan")
        return plan_dir_target(plan_dir, model)
    if model is None:
        raise InputError("--model is required: a model directory or a Hugging Face repo id")
    if local is not None:
        check_local(local, backend)
        return local_target(local, model, strategy or "auto")
    assert cluster is not None
    return cluster_target(cluster, model, strategy, backend)


def _unreachable(cluster: ClusterSpec | None) -> int:
    """Refuse (one line per host) when an ssh host does not answer; 0 when all do."""
    if cluster is None:
        return 0
    from launcher.hosts.reachability import refuse_unreachable

    return refuse_unreachable(cluster)


@click.command("launch")
@click.argument("cluster_file", required=False, metavar="[CLUSTER.yaml]", type=CLUSTER)
@click.option(
    "--local", type=LOCAL, metavar="N", help="Run N ranks on this machine (ring over 127.0.0.1)."
)
@click.option(
    "--plan",
    "plan_dir",
    type=Text("a directory written by `plan --out DIR`"),
    metavar="DIR",
    help="Use plan.json + hostfile.json from `plan --out DIR`.",
)
@click.option("--model", type=MODEL, metavar="M", help="Model directory or Hugging Face repo id.")
@click.option("--prompt", type=PROMPT, required=True, help="The prompt.")
@click.option("--max-tokens", type=TOKENS, default=100, show_default=True)
@click.option("--temp", type=TEMP, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=TOP_P, default=1.0, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@placement_options
@click.option("--ignore-chat-template", is_flag=True, help="Feed the prompt as is.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line at the end.")
@deadline_options("every rank is stopped")
@speculative_option
@draft_model_option
@hub_option
@click.option("--job-option", multiple=True, hidden=True, help="KEY=JSON for every rank's job.")
def launch(
    cluster_file: str | None,
    local: int | None,
    plan_dir: str | None,
    model: str | None,
    prompt: str,
    max_tokens: int,
    temp: float,
    top_p: float,
    seed: int,
    strategy: str | None,
    backend: str | None,
    ignore_chat_template: bool,
    as_json: bool,
    rank_timeout: float,
    stall_timeout: float,
    load_timeout: float,
    speculative: str,
    draft_model: str | None,
    no_hub: bool,
    job_option: tuple[str, ...],
) -> int:
    """Run the model across the hosts and stream the generated text."""
    deadlines = check_deadlines(rank_timeout, load_timeout, stall_timeout)
    options = {"speculative": speculative, **job_options(job_option)}
    if no_hub:
        forbid_hub()
    if sum(x is not None for x in (cluster_file, local, plan_dir)) != 1:
        raise InputError("give exactly one of CLUSTER.yaml, --local N or --plan DIR")
    cluster = read_cluster(cluster_file) if cluster_file is not None else None
    if code := _unreachable(cluster):  # before probing: probes of a dead host only time out
        return code
    try:
        target = resolve_target(cluster, local, plan_dir, model, strategy, backend)
    except PlanRefused as e:
        click.echo(f"mlx-cluster: error: {e}", err=True)
        return EXIT_RANK_FAILED
    if plan_dir is not None and (code := _unreachable(target.cluster)):
        return code
    options.update(draft_model_for_ranks(model or target.plan.model, draft_model, speculative))
    generation = Generation(prompt, max_tokens, temp, top_p, seed, not ignore_chat_template)
    run = run_launch(
        target,
        model_for_ranks(model or target.plan.model),
        generation,
        deadlines,
        None if as_json else sys.stdout,
        options,
        hub=not no_hub,
    )
    out = run.outcome
    if out.interrupted:
        click.echo("mlx-cluster: interrupted; every rank was stopped", err=True)
    elif out.failure is not None:
        click.echo(f"mlx-cluster: error: {out.failure.message()}", err=True)
    elif as_json:
        click.echo(run.json_line())
    else:
        blas = blas_lines(run.blas, [rank.host for rank in target.plan.ranks])
        click.echo(" | ".join([summary_line(out.result or {}, target), *blas]))
    return out.exit_code
