"""What `launch`, `serve` and `bench` share: where the ranks run, and how long they may stall.

One definition each, so the three commands accept and refuse the same things the same way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from launcher.ranks.supervisor import Deadlines
from topology.cluster_file import BACKENDS, STRATEGIES
from topology.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])


def check_hosts_source(cluster_file: str | None, local: int | None, backend: str | None) -> None:
    """Exactly one of CLUSTER.yaml or --local N; --local is N ranks over ring on 127.0.0.1."""
    if (cluster_file is None) == (local is None):
        raise InputError("give exactly one of CLUSTER.yaml or --local N")
    check_local(local, backend)


def check_local(local: int | None, backend: str | None) -> None:
    if local is None:
        return
    if local < 1:
        raise InputError(f"--local needs at least 1 rank, got {local}")
    if backend not in (None, "auto", "ring"):
        raise InputError(f"--local runs over ring on 127.0.0.1; --backend {backend} needs hosts")


def check_deadlines(rank_timeout: float, load_timeout: float) -> Deadlines:
    if not math.isfinite(rank_timeout) or not math.isfinite(load_timeout):
        raise InputError("--rank-timeout and --load-timeout must be finite numbers of seconds")
    if rank_timeout <= 0:
        raise InputError(f"--rank-timeout must be a positive number of seconds, got {rank_timeout}")
    if load_timeout < rank_timeout:
        raise InputError("--load-timeout must be at least --rank-timeout")
    return Deadlines(rank_timeout_s=rank_timeout, load_timeout_s=load_timeout)


def job_options(items: tuple[str, ...]) -> dict[str, Any]:
    """The hidden --job-option KEY=JSON flags (test hooks such as fail_at_token) as a dict."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key] = json.loads(value) if sep else True
        except json.JSONDecodeError:
            raise InputError(f"--job-option {item}: the value must be JSON") from None
    return out


def placement_options(f: F) -> F:
    """--strategy and --backend."""
    f = click.option(
        "--backend", type=click.Choice(BACKENDS), help="Default: the best one available."
    )(f)
    return click.option(
        "--strategy", type=click.Choice(STRATEGIES), help="Default: the cluster's, or auto."
    )(f)


def deadline_options(rank_timeout_s: float, what: str) -> Callable[[F], F]:
    """--rank-timeout (default per command) and --load-timeout."""

    def add(f: F) -> F:
        f = click.option(
            "--load-timeout",
            type=float,
            default=Deadlines.load_timeout_s,
            show_default=True,
            help="The same allowance while weights load (reset by each loading step).",
        )(f)
        return click.option(
            "--rank-timeout",
            type=float,
            default=rank_timeout_s,
            show_default=True,
            help=f"Seconds a rank may go silent or make no progress before {what}.",
        )(f)

    return add
