"""Where `bench --calibrate` keeps its measurements and where planning reads them back.

One JSON file: $MLX_CLUSTER_CACHE/calibration.json, else ~/.cache/mlx-cluster/calibration.json.
A new calibration replaces only the backends and hosts it measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from cluster.files.cache import CACHE_ENV, cache_root
from topology.errors import InputError
from topology.planning.calibration import Calibration
from topology.untrusted import load_json

FILE_NAME = "calibration.json"
_MAX_BYTES = 1 << 20  # a few measurements per backend and host: a few KB


def calibration_path() -> Path:
    return cache_root() / FILE_NAME


def load_calibration(path: Path | None = None) -> Calibration | None:
    """The saved calibration, None when there is none; InputError when the file is broken."""
    path = path or calibration_path()
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(
            f"{path}: cannot read it ({e}); delete it or re-run bench --calibrate"
        ) from None
    try:
        raw = load_json(data, str(path), max_bytes=_MAX_BYTES)
    except InputError as e:
        raise InputError(f"{e}; delete it or re-run `mlx-cluster bench --calibrate`") from None
    try:
        return Calibration.from_json(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(
            f"{path}: not a calibration file ({type(e).__name__}: {e}); "
            "delete it or re-run `mlx-cluster bench --calibrate`"
        ) from None


def save_calibration(new: Calibration, path: Path | None = None) -> Path:
    """Merge `new` into the saved calibration (atomically replaced) and return the path."""
    path = path or calibration_path()
    old = load_calibration(path) or Calibration()
    merged = old.merged(new)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(merged.to_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        raise InputError(
            f"cannot write {path} ({e}); set {CACHE_ENV} to a writable folder"
        ) from None
    return path
