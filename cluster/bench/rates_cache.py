"""A host's measured rates kept between runs: $MLX_CLUSTER_CACHE (else ~/.cache/mlx-cluster)
/ rates-<key>.json, so a probe, the agent or `--local N` measure a machine once, not on every
`launch` (a few seconds each, more on a Mac's first Metal start).

The key is what the rates depend on besides the hardware: the host, the interpreter (and its mlx
and mlx-cluster versions), the BLAS a rank here would use and its thread settings. A missing,
broken or other-key file is measured again; `python -m cluster.microbench --fresh` always is.
No MLX here: a hit must cost milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster import blas
from cluster.files.cache import cache_root
from topology.host_rates import DEFAULT_KINDS
from topology.untrusted import parse_json

# 3: a layer's other work too; 4: shaped rates as medians (kept rates of older formats are
# measured again)
RATES_FORMAT = "4"
MAX_BYTES = 64 * 1024  # a few dozen numbers
# What changes the rates besides the code: OpenBLAS's and OpenMP's thread counts.
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def rates_key() -> dict[str, str]:
    """What cached rates were measured with, from this process's environment (before a BLAS
    re-execution changes it); a change means measuring again."""
    return {
        "format": RATES_FORMAT,
        "host": socket.gethostname(),
        "python": sys.executable,
        "mlx": _version("mlx"),
        "mlx-cluster": _version("mlx-cluster"),
        "blas": blas.probe_line(),
        "cores": str(os.cpu_count() or 0),
        "kinds": ",".join(DEFAULT_KINDS),  # what a kept run holds
        **{name: os.environ.get(name, "") for name in THREAD_VARIABLES},
    }


def shapes_text(shapes: Sequence[tuple[int, int, int]]) -> str:
    """microbench --shapes's text: KxN, or KxN*C for a matrix used C times a token."""
    return ",".join(f"{k}x{n}" + (f"*{c}" if c != 1 else "") for k, n, c in shapes)


def shaped_key(
    key: dict[str, str], shapes: Sequence[tuple[int, int, int]], kind: str = "float32"
) -> dict[str, str]:
    """The key of rates timed again on a model's matrices in `kind`: kept apart from the
    machine's (float32's keep the key they had before other kinds were timed so)."""
    if not shapes:
        return key
    kept = {**key, "shapes": shapes_text(shapes)}
    return kept if kind == "float32" else {**kept, "shape_kind": kind}


def rates_path(key: dict[str, str]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"rates-{digest}.json"


def cached(key: dict[str, str]) -> dict[str, Any] | None:
    """The rates kept for this key (rates.json's object), or None."""
    try:
        with rates_path(key).open("rb") as f:
            data = f.read(MAX_BYTES + 1)
        raw = parse_json(data.decode("utf-8")) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError):  # missing, unreadable, not JSON: measured again
        return None
    if not isinstance(raw, dict) or raw.get("key") != key or not isinstance(raw.get("rates"), dict):
        return None
    return dict(raw["rates"])


def keep(key: dict[str, str], rates: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file; two writers: the last one wins)."""
    path = rates_path(key)
    text = json.dumps({"key": key, "rates": rates}, indent=1) + "\n"
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
