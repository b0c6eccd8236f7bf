"""`launch` says which BLAS the ranks use (one summary segment per distinct value, per rank in
--json), and the topology probe records it for Linux hosts (blas.txt)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import LAUNCH_TIMEOUT_S, MLX_CLUSTER, PROMPT, ROOT, tiny_model

from cluster import blas
from launcher.hosts.probe import _probe, probe_local
from launcher.ranks.blas import BlasSeen, blas_lines
from topology.facts import BLAS_FILE
from topology.host_facts import host_facts

__all__ = ["tiny_model"]  # the fixture

OPENBLAS = blas.find_openblas()


def test_blas_lines_one_per_distinct_value_naming_hosts_once() -> None:
    seen = BlasSeen(4)
    seen(0, {"event": "load", "rank": 0, "blas": "openblas 0.3.21, 2 threads (/x)"})
    seen(1, {"event": "load", "rank": 1, "blas": "openblas 0.3.21, 2 threads (/x)"})
    seen(2, {"event": "load", "rank": 2, "blas": "reference (bundled with mlx[cpu])"})
    seen(3, {"event": "decode", "rank": 3, "blas": "ignored: not a load event"})
    seen(9, {"event": "load", "rank": 9, "blas": "no such rank"})
    seen(0, {"event": "load", "rank": 0, "blas": 5})  # not text: kept as it was
    assert seen.values == [
        "openblas 0.3.21, 2 threads (/x)",
        "openblas 0.3.21, 2 threads (/x)",
        "reference (bundled with mlx[cpu])",
        None,
    ]
    assert blas_lines(seen.values, ["h1", "h1", "h2", "h3"]) == [
        "BLAS on h1: openblas 0.3.21, 2 threads (/x)",
        "BLAS on h2: reference (bundled with mlx[cpu])",
    ]
    two = blas_lines(["accelerate", "accelerate"], ["studio-a", "studio-b"])
    assert two == ["BLAS on studio-a, studio-b: accelerate"]
    seen(1, {"event": "load", "blas": "a\nline\x1b[0m" + "x" * 1000})
    assert seen.values[1] is not None and "\n" not in seen.values[1]
    assert len(seen.values[1]) <= 300


def _launch(model: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MLX_CLUSTER, "launch", "--local", "2", "--model", str(model), "--prompt", PROMPT,
         "--max-tokens", "6", *args],
        capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, cwd=ROOT, env=env,
    )  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ranks only")
def test_launch_prints_and_records_the_ranks_blas(tiny_model: Path) -> None:
    if OPENBLAS is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no OpenBLAS installed: run scripts/ci_system_deps")
        pytest.skip("no OpenBLAS on this host (scripts/ci_system_deps installs it)")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", blas.CHOICE_ENV, blas.MARKER_ENV, blas.THREADS_ENV)
    }
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    text = _launch(tiny_model, env=env)
    assert text.returncode == 0, text.stderr
    summary = text.stdout.rstrip("\n").rpartition("\n")[2]
    head, _, said = summary.rpartition(" | BLAS on localhost: ")
    assert head.startswith("prompt: ") and "peak memory: rank 0 " in head
    assert said.startswith("openblas ") and said.endswith(
        f"thread{'s' * (threads != 1)} ({OPENBLAS})"
    )
    assert summary.count("BLAS on") == 1  # one value, said once
    as_json = _launch(tiny_model, "--json", env={**env, blas.CHOICE_ENV: "reference"})
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["blas"] == [blas.REFERENCE, blas.REFERENCE]


def test_probe_records_blas_txt_for_linux_hosts_only() -> None:
    files = probe_local(timeout_s=20)
    assert files[BLAS_FILE] == blas.probe_line() + "\n"
    facts = host_facts("localhost", files)
    assert facts.blas == blas.probe_line()
    gone = probe_local(timeout_s=20, python="/no/such/python3")
    assert gone[BLAS_FILE] is None and "exit 127" in (gone[BLAS_FILE + ".error"] or "")
    assert host_facts("localhost", gone).blas is None  # not recorded: nothing said
    mac = _probe(
        {"uname.txt": ["echo", "Darwin"], BLAS_FILE: ["false"]},
        remote=False,
        timeout_s=5,
        python="python3",
    )
    assert mac == {"uname.txt": "Darwin\n"}  # a Mac is not asked: its MLX uses Accelerate
