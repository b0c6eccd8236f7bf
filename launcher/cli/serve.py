"""`mlx-cluster serve`: an OpenAI-compatible endpoint in front of the cluster's ranks.

The HTTP server runs here, in the launcher process (so it outlives rank restarts); the ranks
run in serve mode (cluster/serve/loop.py). One line on stdout once the model is ready; the log
(failures, re-plans) goes to stderr. Exit codes: 0 stopped by a signal (Ctrl-C, SIGTERM);
1 the first start failed or no plan fits; 2 bad input (flags, files, the model, the port).
"""

from __future__ import annotations

import sys
import threading

import click

from cluster import heap
from launcher.cli.options import (
    CLUSTER,
    LOCAL,
    MODEL,
    PORT,
    Number,
    Text,
    check_deadlines,
    check_hosts_source,
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
from launcher.ranks.supervisor import EXIT_RANK_FAILED, interrupt_flag
from launcher.ranks.target import PlanRefused, model_for_ranks
from launcher.serve import memory_probe
from launcher.serve.cluster import ServeCluster
from launcher.serve.failover import ServeSource, describe
from launcher.serve.http import HttpServer, ServeApp
from launcher.serve.metrics import ServeMetrics
from launcher.serve.runner import RankRunner, ServeLimits
from launcher.serve.tickets import Tickets
from topology.chips import GIB
from topology.errors import InputError
from topology.planning.serving import budget_error

STOP_TIMEOUT_S = 15.0  # ranks get SIGTERM, then SIGKILL after the grace period
CONCURRENCY = Number(int, 1, 1024, note="sequences in one batch")
QUEUE = Number(int, 0, 1_000_000, note="0: no waiting")
CACHE_GB = Number(float, 0, 4096, note="GiB per rank, 0: off")


def _log(message: str) -> None:
    click.echo(f"mlx-cluster: {message}", err=True)


def _source(
    cluster_file: str | None,
    local: int | None,
    model: str | None,
    strategy: str | None,
    backend: str | None,
) -> ServeSource:
    check_hosts_source(cluster_file, local, backend)
    if model is None:
        raise InputError("--model is required: a model directory or a Hugging Face repo id")
    if local is not None:
        return ServeSource(model, strategy, backend, local=local)
    assert cluster_file is not None
    return ServeSource(model, strategy, backend, cluster=read_cluster(cluster_file))


def _listen(host: str, port: int, app: ServeApp) -> HttpServer:
    try:
        server = HttpServer(host, port, app)
        server.start()
    except OSError as e:
        raise InputError(
            f"cannot listen on {host}:{port} ({e.strerror or e}): choose another --port / --host"
        ) from None
    return server


@click.command("serve")
@click.argument("cluster_file", required=False, metavar="[CLUSTER.yaml]", type=CLUSTER)
@click.option("--local", type=LOCAL, help="Run N ranks on this machine (ring over 127.0.0.1).")
@click.option("--model", type=MODEL, help="Model directory or Hugging Face repo id.")
@click.option(
    "--host",
    type=Text("an address to listen on", max_chars=255),
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on.",
)
@click.option("--port", type=PORT, default=8080, show_default=True, help="0: any free port.")
@click.option(
    "--api-key",
    type=Text("an API key", max_chars=4096),
    envvar="MLX_CLUSTER_API_KEY",
    help="Require 'Authorization: Bearer KEY' on /v1/ requests (or set MLX_CLUSTER_API_KEY).",
)
@click.option(
    "--max-concurrency",
    type=CONCURRENCY,
    default=8,
    show_default=True,
    help="Sequences decoding at once (one batch on the ranks).",
)
@click.option(
    "--max-queue",
    type=QUEUE,
    default=64,
    show_default=True,
    help="Requests waiting beyond --max-concurrency; more get 429.",
)
@click.option(
    "--prefix-cache-gb",
    type=CACHE_GB,
    help="Memory per rank for reusing prompt prefixes (0: off). Default: half the plan's "
    "headroom, at most 8.",
)
@placement_options
@deadline_options("serve fails over")
@click.option(
    "--no-rejoin",
    "no_rejoin",
    is_flag=True,
    help="After a failover, do not take lost hosts back when they answer again.",
)
@speculative_option
@draft_model_option
@hub_option
@click.option("--job-option", multiple=True, hidden=True, help="KEY=JSON for every rank's job.")
def serve_cmd(
    cluster_file: str | None,
    local: int | None,
    model: str | None,
    host: str,
    port: int,
    api_key: str | None,
    max_concurrency: int,
    max_queue: int,
    prefix_cache_gb: float | None,
    strategy: str | None,
    backend: str | None,
    rank_timeout: float,
    stall_timeout: float,
    load_timeout: float,
    no_rejoin: bool,
    speculative: str,
    draft_model: str | None,
    no_hub: bool,
    job_option: tuple[str, ...],
) -> int:
    """Serve the model over an OpenAI-compatible HTTP API, re-planning when a rank dies."""
    heap.share_one_arena()  # before any thread: each rank job's new threads would take new arenas
    memory_probe.install(_log)
    cache_bytes = None if prefix_cache_gb is None else int(prefix_cache_gb * GIB)
    deadlines = check_deadlines(rank_timeout, load_timeout, stall_timeout)
    if api_key is not None and not api_key.strip():
        raise InputError("--api-key / MLX_CLUSTER_API_KEY is empty: give a key or leave it unset")
    options = {"speculative": speculative, **job_options(job_option)}
    if no_hub:
        forbid_hub()
    source = _source(cluster_file, local, model, strategy, backend)
    if source.cluster is not None:
        from launcher.hosts.reachability import refuse_unreachable

        if code := refuse_unreachable(source.cluster):
            return code
    try:
        target = source.first_target()
    except PlanRefused as e:
        _log(str(e))
        return EXIT_RANK_FAILED
    assert model is not None
    from launcher.planning.model_source import load_model_spec

    limits = ServeLimits(load_model_spec(model), max_concurrency, cache_bytes)
    memory = limits.memory(target)  # the KV budget: refused here when nothing is left for it
    if (no_room := budget_error(memory)) is not None:
        raise InputError(no_room)
    options.update(draft_model_for_ranks(model, draft_model, speculative))
    metrics = ServeMetrics()
    busy = (
        f"{max_concurrency + max_queue} requests are already open "
        f"(--max-concurrency {max_concurrency} decoding + --max-queue {max_queue} waiting)"
    )
    tickets = Tickets(max_concurrency + max_queue, busy, metrics)
    runner = RankRunner(
        source,
        model_for_ranks(model),
        deadlines,
        limits,
        options,
        _log,
        tickets.route,
        tickets.fail_all,
        metrics,
        open_requests=lambda: len(tickets),
        rejoin=not no_rejoin,
        hub=not no_hub,
    )
    cluster = ServeCluster(runner, tickets)
    metrics.watch(cluster.ranks_up, lambda: len(tickets))
    server = _listen(host, port, ServeApp(cluster, metrics, model, api_key, _log))
    url = f"http://{host}:{server.port}/v1"
    try:
        with interrupt_flag() as stopping:  # Ctrl-C/SIGTERM/SIGHUP: ranks first, then the server
            cluster.start(target)
            _log(f"listening on {url}; loading {model} as {describe(target)} ({target.backend})")
            _log(memory.describe())
            return _run(cluster, stopping, url, model)
    finally:
        cluster.stop(STOP_TIMEOUT_S)
        server.stop(STOP_TIMEOUT_S)


def _run(cluster: ServeCluster, stopping: threading.Event, url: str, model: str) -> int:
    """Wait for the first ready (or failure), print the ready line, then serve until a signal."""
    announced = False
    while not stopping.is_set():
        runner = cluster.runner
        with runner.changed:
            runner.changed.wait(0.2)
            status, target, first = runner.status, runner.target, runner.first_outcome
        if first is not None:
            message = first.failure.message() if first.failure else runner.reason
            _log(f"error: {message}")
            return first.exit_code or EXIT_RANK_FAILED
        if status == "ready" and not announced and target is not None:
            plan = target.plan
            click.echo(
                f"mlx-cluster: serving {model} at {url} "
                f"({plan.strategy} × {len(plan.ranks)} ranks, {target.backend}); Ctrl-C stops"
            )
            sys.stdout.flush()
            announced = True
    _log("stopping: every rank is being stopped")
    return 0
