"""`python -m cluster.microbench` run as the probe runs it: one JSON object parse_rates accepts,
every kind and row count measured, on the BLAS a rank here would use. Only structure and
orderings far beyond noise are checked, never a speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from paths import PYTHON

from cluster import blas
from cluster.bench.rates import best_per_call, median_per_call
from cluster.microbench import DEFAULT_KINDS, KEY_ENV, LONE_RANK
from topology.host_rates import ROWS, parse_rates

OPENBLAS = blas.find_openblas()
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ranks only")


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PYTHON), "-m", "cluster.microbench", *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1  # one line: the object, nothing else on stdout
    raw: dict[str, Any] = json.loads(done.stdout)
    return raw


def test_default_kinds_at_every_row_count_on_this_device() -> None:
    raw = _json(_bench("--seconds", "0.5"))
    rates = parse_rates(json.dumps(raw))
    assert list(rates.matmul_gflops) == list(DEFAULT_KINDS)
    for kind in DEFAULT_KINDS:
        assert sorted(rates.matmul_gflops[kind]) == list(ROWS)
        assert all(g > 0 for g in rates.matmul_gflops[kind].values())
    assert rates.copy_gbs > 0
    assert rates.device == ("gpu" if sys.platform == "darwin" else "cpu")
    assert raw["source"] == "measured" and isinstance(raw["blas"], str)
    # a layer's other work, for the activations' dtypes of the kinds (q4: bfloat16; -float32)
    assert sorted(rates.layer_us) == sorted(rates.exp_ns) == ["bfloat16", "float32"]
    assert all(v > 0 for v in rates.exp_ns.values())
    # a step of 12 layers of a dozen small ops each takes longer than one of 4
    assert all(v > 0 for v in rates.layer_us.values())


def test_a_layers_figures_are_the_median_step_not_the_best(monkeypatch: Any) -> None:
    """Each run is called in turn, one call a sample, the first call of each untimed; a burst
    that makes a sample fast or slow does not set the figure (a clock the runs advance)."""
    from cluster.bench import rates as bench_rates

    now = [0.0]
    monkeypatch.setattr(bench_rates.time, "perf_counter", lambda: now[0])
    calls: list[str] = []

    def run(name: str, seconds: list[float]) -> Any:
        def call() -> None:
            calls.append(name)
            now[0] += seconds[min(len(calls) // 2, len(seconds) - 1)]

        return call

    # timed samples (ms): the 4-layer step's 1, 1, 9 (a burst), the 12-layer step's 0.5, 3, 3
    few = run("few", [0.0, 1e-3, 1e-3, 9e-3])
    many = run("many", [0.0, 3e-3, 0.5e-3, 3e-3])
    assert bench_rates.medians([few, many], budget_s=0.01) == pytest.approx([1e-3, 3e-3])
    assert calls[:4] == ["few", "many", "few", "many"]


def test_a_models_shapes_replace_float32s_decode_points_only(tmp_path: Any) -> None:
    env = {"MLX_CLUSTER_CACHE": str(tmp_path)}
    generic = _json(_bench(env=env))
    shaped = _json(_bench("--shapes", "256x768*4,768x256*4,256x4096", env=env))
    assert shaped["shapes"] == "256x768*4,768x256*4,256x4096"
    for kind, by_rows in generic["matmul_gflops"].items():
        if kind != "float32":
            assert shaped["matmul_gflops"][kind] == by_rows
    assert shaped["matmul_gflops"]["float32"]["512"] == generic["matmul_gflops"]["float32"]["512"]
    # timed again on those shapes: not the 2048x2048 figures
    assert shaped["matmul_gflops"]["float32"]["1"] != generic["matmul_gflops"]["float32"]["1"]
    assert len(list(tmp_path.glob("rates-*.json"))) == 2  # both kept, apart
    assert _json(_bench("--shapes", "256x768*4,768x256*4,256x4096", env=env)) == shaped  # kept


def test_a_bfloat16_models_shapes_replace_bfloat16s_decode_points_only(tmp_path: Any) -> None:
    env = {"MLX_CLUSTER_CACHE": str(tmp_path)}
    generic = _json(_bench(env=env))
    args = ("--shapes", "256x768*4,768x256*4", "--shape-kind", "bfloat16")
    shaped = _json(_bench(*args, env=env))
    for kind, by_rows in generic["matmul_gflops"].items():
        if kind != "bfloat16":
            assert shaped["matmul_gflops"][kind] == by_rows
    assert shaped["matmul_gflops"]["bfloat16"]["1"] != generic["matmul_gflops"]["bfloat16"]["1"]
    assert shaped["one_thread_gflops"] == generic["one_thread_gflops"]  # not a BLAS kind
    float32 = _json(_bench("--shapes", "256x768*4,768x256*4", env=env))
    assert float32 != shaped and len(list(tmp_path.glob("rates-*.json"))) == 3  # kept apart
    assert _bench("--shapes", "8x8", "--shape-kind", "q4").returncode == 2


@pytest.mark.parametrize(
    "shapes", ["256", "0x5", "ax3", "8x8*0", "65536x65536", ",".join(["8x8"] * 17)]
)
def test_bad_shapes_are_refused_before_measuring(shapes: str) -> None:
    done = _bench("--shapes", shapes)
    assert done.returncode == 2 and "--shapes" in done.stderr and "Traceback" not in done.stderr


@linux_only
def test_measures_with_the_blas_and_threads_a_lone_rank_here_gets() -> None:
    if OPENBLAS is None:
        pytest.skip("no OpenBLAS on this host (scripts/ci_system_deps installs it)")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "LD_PRELOAD")}
    done = subprocess.run(
        [str(PYTHON), "-m", "cluster.microbench", "--kinds", "float32", "--seconds", "0.3"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    raw = _json(done)
    threads = blas.threads_for(LONE_RANK)
    assert raw["blas"].startswith("openblas ") and raw["blas"].endswith(f"({OPENBLAS})")
    assert f" {threads} thread{'s' * (threads != 1)} (" in raw["blas"]
    # several threads: float32 (what MLX hands to BLAS) timed again on one, for shared cores
    assert raw["threads"] == threads
    one = raw["one_thread_gflops"]
    assert (sorted(one) == ["float32"]) if threads > 1 else one == {}
    assert all(sorted(map(int, by_rows)) == list(ROWS) for by_rows in one.values())
    # (blas.in_use() names the library loaded in the measuring process. A speed ordering, such
    # as 512 rows against one, flaked under a loaded CI: the rates are not compared here.)


@linux_only
def test_reference_blas_when_a_rank_would_keep_it() -> None:
    raw = _json(_bench("--kinds", "q4", "--seconds", "0.3", env={blas.CHOICE_ENV: "reference"}))
    assert raw["blas"] == blas.REFERENCE
    assert list(raw["matmul_gflops"]) == ["q4"]
    assert sorted(map(int, raw["matmul_gflops"]["q4"])) == list(ROWS)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kinds", "float64"], "--kinds"),
        (["--kinds", "q4,q4"], "twice"),
        (["--kinds", ""], "--kinds"),
        (["--seconds", "nan"], "--seconds"),
        (["--seconds", "0"], "--seconds"),
        (["--seconds", "1e9"], "--seconds"),
    ],
)
def test_bad_options_are_refused_before_measuring(args: list[str], says: str) -> None:
    done = _bench(*args)
    assert done.returncode == 2 and done.stdout == "" and says in done.stderr
    assert "Traceback" not in done.stderr


@linux_only
def test_a_blas_setting_a_rank_would_refuse_fails_with_one_line() -> None:
    done = _bench("--seconds", "0.3", env={blas.CHOICE_ENV: "libopenblas.so"})
    assert done.returncode == 1 and done.stdout == ""
    assert blas.CHOICE_ENV in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("key", ["{not json", "[1]", '{"host": 5}'])
def test_a_bad_cache_key_from_the_caller_fails_with_one_line(key: str) -> None:
    done = _bench("--seconds", "0.3", env={KEY_ENV: key})
    assert done.returncode == 1 and done.stdout == ""
    assert f"{KEY_ENV} must be a JSON object of strings" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_default_run_is_kept_and_printed_again_until_fresh(tmp_path: Any) -> None:
    """A launch probes every host: the first default run measures and keeps its rates, the next
    prints them back without measuring (the same numbers to the last digit, which no second
    measurement gives), --fresh measures again; other options are never kept."""
    env = {"MLX_CLUSTER_CACHE": str(tmp_path)}
    first = _json(_bench(env=env))
    kept = list(tmp_path.glob("rates-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["rates"] == first
    assert _json(_bench(env=env)) == first
    fresh = _json(_bench("--fresh", env=env))
    assert fresh != first  # measured again: timings never repeat to every digit
    assert json.loads(kept[0].read_text())["rates"] == fresh
    narrow = _json(_bench("--kinds", "float32", "--seconds", "0.3", env=env))
    assert list(narrow["matmul_gflops"]) == ["float32"]
    assert json.loads(kept[0].read_text())["rates"] == fresh  # a partial run is not kept


def test_shaped_rates_take_the_median_sample_where_the_others_take_the_best() -> None:
    """A run whose samples are mostly slow: the median sees them, the best sample does not."""

    def run_with(durations: list[float]) -> Any:
        taken = iter(durations * 100)

        def run(calls: int) -> None:
            time.sleep(next(taken))  # the whole sample, whatever its calls

        return run

    pattern = [0.001, 0.02, 0.02]  # one fast sample in three
    best = best_per_call(run_with(pattern), 0.5)
    median = median_per_call(run_with(pattern), 0.5)
    assert median > 2 * best
