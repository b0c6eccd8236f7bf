"""Memory limits refused before anything launches: a wired limit above the host's memory, one
too small for even a rank's weights and margin, and a prefix cache that leaves no KV budget.
Each is one line naming the rank and the numbers, exit 2 (the real CLI in a subprocess)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import synth
import yaml
from paths import FIXTURES, MLX_CLUSTER

from cluster.tiny_model import write_tiny_model
from launcher.planning.cluster_plan import TEST_WIRED_LIMIT_ENV

CLI = MLX_CLUSTER
LLAMA = str(FIXTURES / "models" / "llama-3.3-70b-instruct-bf16")  # about 132 GiB of weights


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def snapshot_with_limit(tmp_path: Path, wired_gb: float) -> Path:
    snap = synth.cluster(2, memory_gb=256).write(tmp_path / "snap")
    host = snap / "studio-b" / "host.yaml"
    raw = yaml.safe_load(host.read_text()) if host.exists() else {}
    host.write_text(yaml.safe_dump({**(raw or {}), "wired_limit_gb": wired_gb}))
    return snap


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", layers=2, hidden=64)


def test_a_wired_limit_above_the_hosts_memory(tmp_path: Path) -> None:
    snap = snapshot_with_limit(tmp_path, 9999)
    line = one_line(run("plan", "--snapshot", snap, "--model", LLAMA))
    assert "rank 1 on studio-b: wired_limit_gb 9999 is more than the host's 256 GiB" in line
    assert "give at most 256" in line


def test_a_wired_limit_too_small_for_the_weights(tmp_path: Path) -> None:
    snap = snapshot_with_limit(tmp_path, 3)
    for strategy in ("tensor", "pipeline", "auto"):
        line = one_line(run("plan", "--snapshot", snap, "--model", LLAMA, "--strategy", strategy))
        assert line.startswith(
            "mlx-cluster: error: rank 1 on studio-b: its memory budget of 3.0 GiB"
        )
        assert "of weights +" in line and "raise wired_limit_gb to at least" in line


def test_serve_refuses_a_budget_too_small_for_the_weights_before_launching(tiny: Path) -> None:
    out = run("serve", "--local", "2", "--model", tiny, "--port", "0",
              env={TEST_WIRED_LIMIT_ENV: "1024"})  # fmt: skip
    line = one_line(out)
    assert "rank 0 on localhost: its memory budget of 512.0 MiB (the wired limit)" in line
    assert "listening" not in out.stderr  # nothing was started


def test_serve_refuses_a_prefix_cache_that_leaves_no_kv_budget(tiny: Path) -> None:
    out = run("serve", "--local", "1", "--model", tiny, "--port", "0",
              "--prefix-cache-gb", "4096")  # fmt: skip
    line = one_line(out)
    assert "rank 0 on localhost has no memory for KV caches:" in line
    assert "4096 GiB prefix cache" in line and "give a smaller --prefix-cache-gb" in line
    assert "listening" not in out.stderr


def test_a_limit_that_fits_still_plans(tmp_path: Path) -> None:
    snap = snapshot_with_limit(tmp_path, 200)
    out = run("plan", "--snapshot", snap, "--model", LLAMA)
    assert out.returncode == 0, out.stderr
