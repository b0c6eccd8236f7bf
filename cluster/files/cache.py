"""Where mlx-cluster keeps its files on a host: $MLX_CLUSTER_CACHE, else ~/.cache/mlx-cluster.

Calibration, file digests and the models copied from peers all live there. No MLX here.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MLX_CLUSTER_CACHE"


def cache_root() -> Path:
    cache = os.environ.get(CACHE_ENV)
    return Path(cache).expanduser() if cache else Path.home() / ".cache" / "mlx-cluster"
