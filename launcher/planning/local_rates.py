"""This machine's measured rates for `--local N`: `python -m cluster.microbench` run once, then read
back from $MLX_CLUSTER_CACHE (else ~/.cache/mlx-cluster) as rates-<key>.json.

The key is what the rates depend on: the host, the interpreter the ranks run (and its mlx and
mlx-cluster versions), the BLAS a rank here would use and its thread settings. A missing or
broken file is measured again; a failed measurement leaves the rates unknown (the chip table
stands in) and is not kept, so the next plan tries again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from cluster import blas
from cluster.files.cache import cache_root
from topology.errors import one_line
from topology.host_rates import HostRates, parse_rates
from topology.untrusted import parse_json

MEASURE_TIMEOUT_S = 60.0  # the benchmark takes a few seconds; a Mac's first Metal start more
_MAX_BYTES = 64 * 1024  # a few dozen numbers
# What changes the rates besides the code: OpenBLAS's and OpenMP's thread counts.
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def rates_key() -> dict[str, str]:
    """What the cached rates were measured with; a change means measuring again."""
    return {
        "host": socket.gethostname(),
        "python": sys.executable,
        "mlx": _version("mlx"),
        "mlx-cluster": _version("mlx-cluster"),
        "blas": blas.probe_line(),
        "cores": str(os.cpu_count() or 0),
        **{name: os.environ.get(name, "") for name in _THREAD_VARIABLES},
    }


def rates_path(key: dict[str, str]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"rates-{digest}.json"


def _cached(path: Path, key: dict[str, str]) -> HostRates | None:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_BYTES + 1)
        raw = parse_json(data.decode("utf-8")) if len(data) <= _MAX_BYTES else None
        if not isinstance(raw, dict) or raw.get("key") != key:
            return None
        return parse_rates(json.dumps(raw.get("rates")))
    except (OSError, ValueError):  # missing, unreadable, not JSON, not rates: measured again
        return None


def _warn(line: str) -> None:
    click.echo(f"mlx-cluster: warning: {line}", err=True)


def measure() -> str | None:
    """rates.json's text from this interpreter's microbenchmark; None (said on stderr) when it
    fails."""
    argv = [sys.executable, "-m", "cluster.microbench"]
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=MEASURE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
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


def _keep(path: Path, key: dict[str, str], rates: HostRates) -> None:
    """Write atomically (a reader never sees half a file; two writers: the last one wins)."""
    text = json.dumps({"key": key, "rates": rates.to_json()}, indent=1) + "\n"
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:  # an unwritable cache: measured again next time, nothing else lost
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def local_rates() -> HostRates | None:
    """This machine's rates: cached when measured before with the same key, else measured now
    (a few seconds) and cached; None when the measurement failed."""
    key = rates_key()
    path = rates_path(key)
    cached = _cached(path, key)
    if cached is not None:
        return cached
    text = measure()
    if text is None:
        return None
    try:
        rates = parse_rates(text)
    except ValueError as e:
        _warn(f"this machine's microbenchmark printed no rates ({e}); using the chip table")
        return None
    _keep(path, key, rates)
    return rates
