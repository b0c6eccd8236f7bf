"""The server under soak: a tiny model, `mlx-cluster serve --local N` started with a marker in its
environment (its ranks inherit it, so /proc finds them), and how much memory its processes hold."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_bench.procs import Proc, start_proc
from serve_bench.servers import CLI, READY_LINE

from launcher.ranks.marked import marked_rank_pids

MARKER_VAR = "MLX_CLUSTER_SOAK_MARKER"
HTTP_TIMEOUT_S = 5.0


class SoakError(Exception):
    """The soak cannot go on (the server never came up, or exited)."""


@dataclass
class Served:
    proc: Proc
    base_url: str  # .../v1
    marker: str

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def rank_pids(self) -> dict[int, int]:
        return rank_pids(self.marker)


def tiny_model(directory: Path) -> Path:
    """12 heads over 6 KV heads divide by 1, 2 and 3 ranks, so every re-plan of --local 3 can
    stay tensor parallel (or go pipeline) without refusing the model."""
    from cluster.tiny_model import write_tiny_model

    return write_tiny_model(directory, layers=4, hidden=384, heads=12, kv_heads=6, vocab=384)


def start(model: Path, local: int, logs: Path, marker: str, extra: list[str]) -> Proc:
    argv = [CLI, "serve", "--local", str(local), "--model", str(model), "--port", "0", *extra]
    return start_proc("serve", argv, logs, {MARKER_VAR: marker})


def wait_ready(proc: Proc, marker: str, timeout_s: float) -> Served:
    """Serve prints "mlx-cluster: serving MODEL at URL" on stdout once rank 0 is ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = READY_LINE.search(proc.out.read_text(errors="replace"))
        if found:
            return Served(proc, found.group(1), marker)
        if not proc.running:
            raise SoakError(f"serve exited ({proc.popen.returncode}) before ready\n{proc.tail()}")
        time.sleep(0.3)
    raise SoakError(f"serve not ready after {timeout_s:.0f} s\n{proc.tail()}")


def rank_pids(marker: str) -> dict[int, int]:
    """{MLX_RANK: pid} of the live `cluster.rank` processes whose environment has our marker."""
    return marked_rank_pids(MARKER_VAR, marker)


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def get(url: str, timeout_s: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """Status and body of a GET; (0, b"") when nothing answered in time."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def health(root: str) -> tuple[int, dict[str, Any]]:
    status, body = get(root + "/health")
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    return status, parsed if isinstance(parsed, dict) else {}
