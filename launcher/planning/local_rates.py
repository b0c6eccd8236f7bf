"""This machine's measured rates for `--local N`: `python -m cluster.microbench` run once, then read
back in this process from the rates cache (cluster/bench/rates_cache.py, the file the
microbenchmark itself keeps). A failed measurement leaves the rates unknown (the chip table
stands in) and is not kept, so the next plan tries again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click

from cluster.bench import rates_cache
from cluster.microbench import KEY_ENV
from topology.errors import one_line
from topology.host_rates import HostRates, parse_rates

MEASURE_TIMEOUT_S = 60.0  # the benchmark takes a few seconds; a Mac's first Metal start more
rates_key, rates_path = rates_cache.rates_key, rates_cache.rates_path  # the cache's, re-exported


def _cached(key: dict[str, str]) -> HostRates | None:
    raw = rates_cache.cached(key)
    try:
        return parse_rates(json.dumps(raw)) if raw is not None else None
    except ValueError:  # kept, but not rates: measured again
        return None


def _warn(line: str) -> None:
    click.echo(f"mlx-cluster: warning: {line}", err=True)


def measure(key: dict[str, str]) -> str | None:
    """rates.json's text from this interpreter's microbenchmark, which keeps it under `key`;
    None (said on stderr) when it fails."""
    argv = [sys.executable, "-m", "cluster.microbench"]
    env = {**os.environ, KEY_ENV: json.dumps(key)}
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=MEASURE_TIMEOUT_S, stdin=subprocess.DEVNULL,
            env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = one_line(str(e), 200)
        _warn(f"could not measure this machine's rates ({reason}); using the chip table")
        return None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no error output"]
        _warn(
            f"could not measure this machine's rates (exit {done.returncode}: "
            f"{one_line(err[-1], 200)}); using the chip table"
        )
        return None
    return done.stdout.decode("utf-8", "replace")


def local_rates() -> HostRates | None:
    """This machine's rates: cached when measured before with the same key, else measured now
    (a few seconds) and cached; None when the measurement failed."""
    key = rates_key()
    cached = _cached(key)
    if cached is not None:
        return cached
    text = measure(key)  # the microbenchmark keeps what it measured (with its BLAS line)
    if text is None:
        return None
    try:
        return parse_rates(text)
    except ValueError as e:
        _warn(f"this machine's microbenchmark printed no rates ({e}); using the chip table")
        return None
