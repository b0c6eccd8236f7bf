"""`mlx-cluster bench` end to end: real local ranks over ring, a tiny random-weight model.

Every run gets its own MLX_CLUSTER_CACHE, so no saved calibration leaks between tests (or in
from the user's ~/.cache). Speeds are only checked for consistency, never against a clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import paths
import pytest
from launch_helpers import MARKER_VAR, rank_pids

from cluster.tiny_model import write_tiny_model
from launcher.bench.report import Row, measure, percentile, with_speedups
from launcher.planning.calibration_store import load_calibration
from launcher.planning.cluster_plan import local_share_rates, measured_machine
from launcher.planning.model_source import load_model_spec
from topology.planning.plan import plan_local

ROOT = Path(__file__).resolve().parents[2]
MLX_CLUSTER = str(paths.MLX_CLUSTER)
RUN_TIMEOUT_S = 300.0
TIB = 1 << 40
CONTRACT = (
    "hosts", "strategy", "backend", "prompt_tps", "generation_tps", "ttft_s", "itl_p50_ms",
    "itl_p99_ms", "peak_memory_bytes", "speedup", "efficiency", "bandwidth_gbps",
    "predicted_decode_tok_s",
)  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 layers, 4 heads / 2 KV heads: tensor and pipeline both split over 2 ranks."""
    return write_tiny_model(tmp_path_factory.mktemp("bench") / "tiny", layers=4, hidden=64)


def bench(
    cache: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    marker = uuid.uuid4().hex
    full_env = {**os.environ, "MLX_CLUSTER_CACHE": str(cache), MARKER_VAR: marker, **(env or {})}
    try:
        return subprocess.run(
            [MLX_CLUSTER, "bench", *args],
            capture_output=True, text=True, env=full_env, cwd=ROOT, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
    finally:
        assert rank_pids(marker) == {}, "a rank outlived the bench"


def test_local_bench_writes_every_field_a_table_and_a_chart(model: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    done = bench(
        tmp_path / "cache", "--local", "2", "--model", str(model), "--sizes", "1,2",
        "-p", "24", "-g", "8", "--trials", "2", "--json", str(out), "--plot", str(png),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    for key in ("chip", "cores", "memory_bytes", "os", "mlx_version"):
        assert doc["machine"][key], key
    results = doc["results"]
    assert {(r["hosts"], r["strategy"]) for r in results} == {
        (1, "tensor"), (1, "pipeline"), (2, "tensor"), (2, "pipeline"),
    }  # fmt: skip
    base = {r["strategy"]: r["generation_tps"] for r in results if r["hosts"] == 1}
    for r in results:
        assert set(CONTRACT) <= set(r), set(CONTRACT) - set(r)
        assert list(r)[: len(CONTRACT)] == list(CONTRACT)
        assert r["backend"] == "ring"
        assert r["prompt_tps"] > 0 and r["generation_tps"] > 0 and r["ttft_s"] > 0
        assert 0 < r["itl_p50_ms"] <= r["itl_p99_ms"]
        assert len(r["peak_memory_bytes"]) == r["hosts"]
        assert all(0 < b < TIB for b in r["peak_memory_bytes"])
        speedup = r["generation_tps"] / base[r["strategy"]]
        assert r["speedup"] == pytest.approx(speedup, rel=1e-3)
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["hosts"], rel=1e-3)
        assert r["bandwidth_gbps"] > 0
        assert r["predicted_decode_tok_s"] > 0
        assert r["predicted_calibrated_tok_s"] is None  # nothing calibrated in this cache
    assert doc["skipped"] == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].startswith("| hosts | strategy | backend | prompt tok/s | gen tok/s")
    assert len(table) == 2 + len(results)
    progress = [line for line in done.stderr.splitlines() if line.startswith("bench [")]
    assert len(progress) == 3, done.stderr  # 1 host once, then tensor and pipeline over 2


def test_bench_with_speculation_reports_the_accepted_drafts(model: Path, tmp_path: Path) -> None:
    """--speculative on, alone and with a draft model: the counts are in the JSON, the table
    and the progress line; off has none."""
    runs = {}
    modes = {
        "on": ("--speculative", "on"),
        "model": ("--speculative", "on", "--draft-model", str(model)),
        "off": ("--speculative", "off"),
    }
    for mode, flags in modes.items():
        out = tmp_path / f"{mode}.json"
        done = bench(
            tmp_path / "cache", "--local", "2", "--model", str(model), "--sizes", "2",
            "--strategies", "pipeline", "-p", "16", "-g", "48", "--trials", "1",
            *flags, "--json", str(out),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (row,) = json.loads(out.read_text())["results"]
        runs[mode] = (row, done)
    on, _ = runs["on"]  # a random model rarely goes on as its prompt did: few drafts, if any
    assert on["drafted_tokens"] >= on["accepted_tokens"] >= 0
    row, done = runs["model"]  # the target as its own draft model: every draft is accepted
    assert row["drafted_tokens"] == row["accepted_tokens"] > 0 and row["draft_checks"] > 0
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].endswith("| accepted | tokens/check |")
    assert f"| {row['accepted_tokens']}/{row['drafted_tokens']} |" in table[2]
    assert "drafted tokens accepted" in done.stderr
    off, done = runs["off"]
    assert off["drafted_tokens"] == off["accepted_tokens"] == off["draft_checks"] == 0
    assert "accepted" not in done.stdout and "drafted" not in done.stderr


def test_calibrate_saves_numbers_the_planner_then_uses(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, out = tmp_path / "cache", tmp_path / "bench.json"
    done = bench(
        cache, "--local", "2", "--model", str(model), "--sizes", "2", "--strategies", "tensor",
        "-p", "8", "-g", "4", "--trials", "1", "--calibrate", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "calibration: saved to" in done.stderr
    calibration = load_calibration(cache / "calibration.json")
    assert calibration is not None
    (link,) = calibration.links
    assert (link.cost_name, link.ranks, link.small_bytes) == ("ring-local", 2, 64 * 4)
    assert 0 < link.small_s < link.large_s
    # the mini model decoded whole, in tensor shares and in pipeline stages over both ranks:
    # shares all-reduce twice a layer, which a whole model never does
    assert link.steps is not None and link.steps.layers == 8
    assert 0 < link.steps.alone_s < link.steps.tensor_s and link.steps.pipeline_s > 0
    assert (calibration.bandwidth("localhost") or 0) > 0
    row = json.loads(out.read_text())["results"][0]
    assert row["predicted_calibrated_tok_s"] is not None
    assert row["predicted_calibrated_tok_s"] != row["predicted_decode_tok_s"]
    assert row["prediction_error_calibrated"] is not None

    # `plan` (and so `launch`) read the saved file: the prediction is the calibrated one. Both
    # folders hold this machine's measured rates too (bench and plan keep them there): planned
    # here from the same file, the figures are the CLI's to the last digit.
    spec = load_model_spec(str(model))
    predictions = {}
    for folder, calibration_used in ((cache, calibration), (tmp_path / "empty", None)):
        shown = subprocess.run(
            [MLX_CLUSTER, "plan", "--local", "2", "--model", str(model), "--strategy", "tensor",
             "--json"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
            env={**os.environ, "MLX_CLUSTER_CACHE": str(folder)},
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        monkeypatch.setenv("MLX_CLUSTER_CACHE", str(folder))
        want = plan_local(measured_machine(spec), 2, spec, strategy="tensor",
                          calibration=calibration_used,
                          share_rates=local_share_rates(spec, 2, "tensor"))  # fmt: skip
        assert want.ok and measured_machine(spec).rates is not None
        predictions[folder] = json.loads(shown.stdout)["predicted_decode_tok_s"]
        assert predictions[folder] == want.predicted_decode_tok_s
    host = measured_machine(spec)
    uncalibrated = plan_local(host, 2, spec, strategy="tensor")
    calibrated = plan_local(host, 2, spec, strategy="tensor", calibration=calibration)
    assert calibrated.predicted_decode_tok_s != uncalibrated.predicted_decode_tok_s


def test_rates_and_latencies_from_token_times() -> None:
    result = {
        "prompt_tokens": 10,
        "peak_memory_bytes": [7, 9],
        "trials": [{"token_times_s": [0.5, 0.6, 0.8, 0.9]}, {"token_times_s": [0.3, 0.4, 0.5]}],
    }
    m = measure(result)
    assert m.ttft_s == pytest.approx(0.4)  # median of 0.5 and 0.3
    assert m.prompt_tps == pytest.approx((20 + 10 / 0.3) / 2, rel=1e-3)
    assert m.generation_tps == pytest.approx((3 / 0.4 + 2 / 0.2) / 2, rel=1e-3)
    # gaps 0.1 0.2 0.1 0.1 0.1: p50 0.1 s; p99 interpolates towards the one slow gap
    assert m.itl_p50_ms == pytest.approx(100.0)
    assert m.itl_p99_ms == pytest.approx(196.0)
    assert (m.peak_memory_bytes, m.trials) == ((7, 9), 2)
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        measure({**result, "trials": [{"token_times_s": [0.5]}]})


def test_speedup_is_against_the_one_host_run() -> None:
    def row(hosts: int, tps: float) -> Row:
        m = measure({"prompt_tokens": 1, "peak_memory_bytes": [1] * hosts,
                     "trials": [{"token_times_s": [1.0, 1.0 + 1 / tps]}]})  # fmt: skip
        return Row(hosts, "tensor", "ring", m, 0.0, None)

    one, two, four = with_speedups([row(1, 10.0), row(2, 15.0), row(4, 30.0)])
    assert (one.speedup, one.efficiency) == (1.0, 1.0)
    assert two.speedup == pytest.approx(1.5) and two.efficiency == pytest.approx(0.75)
    assert four.speedup == pytest.approx(3.0) and four.efficiency == pytest.approx(0.75)
    (alone,) = with_speedups([row(2, 15.0)])  # no 1-host run: nothing to compare with
    assert alone.speedup is None and alone.efficiency is None


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--sizes", "0"], "--sizes"),
        (["--sizes", "1,x"], "--sizes"),
        (["--sizes", "3"], "only 2 host(s)"),
        (["--strategies", "foo"], "--strategies"),
        (["-g", "0"], "-g/--gen-tokens must be at least 2"),
        (["-p", "0"], "-p/--prompt-tokens must be at least 1"),
        (["--trials", "0"], "--trials"),
        (["--json", "/nonexistent-dir/x.json"], "does not exist"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    model: Path, tmp_path: Path, flags: list[str], words: str
) -> None:
    done = bench(tmp_path, "--local", "2", "--model", str(model), *flags)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlx-cluster: error:"), done.stderr
    assert words in lines[0]
    assert done.stdout == ""


def test_plot_without_matplotlib_says_how_to_install_it(model: Path, tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("no matplotlib here (test shim)")\n')
    done = bench(
        tmp_path, "--local", "1", "--model", str(model), "--plot", str(tmp_path / "x.png"),
        env={"PYTHONPATH": str(shim.parent)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "mlx-cluster: error: --plot needs matplotlib: pip install matplotlib"
    ]


def test_a_broken_calibration_file_is_named_with_the_fix(model: Path, tmp_path: Path) -> None:
    (tmp_path / "calibration.json").write_text('{"links": "nope"}')
    done = bench(tmp_path, "--local", "1", "--model", str(model))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "calibration.json" in line and "re-run `mlx-cluster bench --calibrate`" in line


def test_bench_and_calibrate_over_ssh_on_two_emulated_hosts(model: Path, tmp_path: Path) -> None:
    """The cluster-file path: probed hosts, the first k of them, ranks started over real ssh."""
    import time

    from hosts.launching import wait_until_empty
    from hosts.netns import EmulatedHosts, require

    require()
    cache, out = tmp_path / "cache", tmp_path / "bench.json"
    with EmulatedHosts(2, topology="switch") as hosts:
        # Linux hosts report no GPU memory: say it, as a user's cluster file must.
        cluster = hosts.cluster_yaml(
            tmp_path / "cluster.yaml", host_keys={"wired_limit_gb": 4}, backend="ring"
        )
        done = bench(
            cache, str(cluster), "--model", str(model), "--sizes", "1,2", "--strategies",
            "tensor", "-p", "8", "-g", "4", "--trials", "1", "--calibrate", "--json", str(out),
            env={"HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        wait_until_empty(hosts, 5, time.monotonic())
    doc = json.loads(out.read_text())
    assert [(r["hosts"], r["backend"]) for r in doc["results"]] == [(1, "ring"), (2, "ring")]
    assert [h["name"] for h in doc["machine"]["hosts"]] == ["h0", "h1"]
    calibration = load_calibration(cache / "calibration.json")
    assert calibration is not None
    assert [(k.cost_name, k.ranks) for k in calibration.links] == [("ring", 2)]
    assert all((calibration.bandwidth(h) or 0) > 0 for h in ("h0", "h1"))
