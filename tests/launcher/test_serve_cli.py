"""`mlx-cluster serve` refusing bad input: one line, exit 2, nothing left running."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from launch_helpers import MLX_CLUSTER, ROOT, tiny_model
from serve_helpers import Server

from cluster.tiny_model import write_tiny_model

__all__ = ["tiny_model"]  # the fixture


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MLX_CLUSTER, "serve", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_bad_flags_are_one_line_and_exit_2(tiny_model: Path) -> None:
    model = ["--model", str(tiny_model)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = [
            (model, "give exactly one of CLUSTER.yaml or --local N"),
            (["--local", "2"], "--model is required"),
            (["--local", "2", "--model", str(tiny_model / "nope")], "no such directory"),
            (["--local", "2", *model, "--port", "70000"], "--port must be"),
            (["--local", "2", *model, "--max-concurrency", "0"], "--max-concurrency must be"),
            (["--local", "2", *model, "--max-queue", "-1"], "--max-queue must be"),
            (["--local", "2", *model, "--prefix-cache-gb", "-1"], "--prefix-cache-gb must be"),
            (["--local", "2", *model, "--prefix-cache-gb", "nan"], "--prefix-cache-gb must be"),
            (["--local", "2", *model, "--prefix-cache-gb", "lots"], "--prefix-cache-gb"),
            (["--local", "2", *model, "--backend", "jaccl"], "needs hosts"),
            (
                ["--local", "2", *model, "--api-key", " "],
                "--api-key / MLX_CLUSTER_API_KEY is empty",
            ),
            (["--local", "2", *model, "--port", port], "cannot listen on 127.0.0.1:" + port),
        ]
        for args, expected in cases:
            done = _run_cli(*args)
            assert done.returncode == 2, (args, done.stderr)
            assert done.stderr.count("\n") == 1 and expected in done.stderr, (args, done.stderr)


def test_first_start_failing_exits_with_the_ranks_reason(tmp_path: Path) -> None:
    """Planning reads only config and index; the rank finds the missing weights and says so."""
    model = write_tiny_model(tmp_path / "broken", layers=2, hidden=64)
    missing = sorted(model.glob("model-*.safetensors"))[-1]
    missing.unlink()
    server = Server("--local", "1", "--model", str(model))
    try:
        code = server.proc.wait(timeout=120)
    finally:
        server.stop()
        assert server.leftover_ranks() == {}
    assert code == 2, server.stderr
    assert missing.name in server.stderr and "Traceback" not in server.stderr
    assert server.stdout == ""  # never announced as serving
