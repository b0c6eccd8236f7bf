"""`--local N` plans with this machine's measured rates: the microbenchmark runs once, then its
result is read back from the cache ($MLX_CLUSTER_CACHE) while nothing it depends on changes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from paths import FIXTURES, MLX_CLUSTER

from cluster import blas
from cluster.bench import rates_cache
from launcher.planning import local_rates as lr
from launcher.planning.cluster_plan import measured_machine
from topology.host_rates import parse_rates
from topology.model.spec import spec_from_config

CANNED = '{"copy_gbs": 3.0, "matmul_gflops": {"float32": {"1": 1.0, "512": 9.0}}, "device": "cpu"}'
LLAMA = FIXTURES / "models" / "llama-3.3-70b-instruct-bf16"
SMOLLM2 = {
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
    "vocab_size": 49152, "tie_word_embeddings": True, "torch_dtype": "float32",
}  # fmt: skip


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MLX_CLUSTER_CACHE", str(folder))
    return folder


def _measured_never(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(key: dict[str, str], shapes: object = (), kind: object = "") -> str | None:
        raise AssertionError("measured again")

    monkeypatch.setattr(lr, "measure", fail)


def _measured_canned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def canned(key: dict[str, str], shapes: object = (), kind: object = "") -> str | None:
        calls.append(1)
        rates_cache.keep(key, json.loads(CANNED))  # as the microbenchmark keeps what it measured
        return CANNED

    monkeypatch.setattr(lr, "measure", canned)
    return calls


def test_measured_once_then_read_back(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = lr.local_rates()  # the real microbenchmark, with this interpreter
    assert first is not None and first.device == "cpu" and first.copy_gbs > 0
    [kept] = cache.glob("rates-*.json")
    assert json.loads(kept.read_text())["key"] == lr.rates_key()
    _measured_never(monkeypatch)
    assert lr.local_rates() == first
    assert measured_machine().rates == first  # what plan --local and launch --local plan with


def test_a_float32_models_own_shapes_are_timed_and_kept_apart(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2's float32 matrices: float32's 1- and 8-row rates are timed on them (kept in a
    file of their own, beside the machine's), every other figure is the machine's; a quantized
    model is planned with the machine's rates."""
    spec = spec_from_config(SMOLLM2)
    shapes = lr.layer_shapes(spec)
    layer = ((576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576))
    assert shapes == (*((k, n, 30) for k, n in layer), (576, 49152, 1))  # 30 layers, the head
    quantized = {**SMOLLM2, "quantization": {"bits": 4, "group_size": 64}}
    assert lr.layer_shapes(spec_from_config(quantized)) == ()
    generic = lr.local_rates()
    model = lr.local_rates(shapes)
    assert generic is not None and model is not None
    assert len(list(cache.glob("rates-*.json"))) == 2
    for kind, by_rows in generic.matmul_gflops.items():
        want = {**by_rows, 1: model.matmul_gflops[kind][1], 8: model.matmul_gflops[kind][8]}
        assert model.matmul_gflops[kind] == (want if kind == "float32" else by_rows)
    assert (model.layer_us, model.exp_ns, model.copy_gbs) == (
        generic.layer_us, generic.exp_ns, generic.copy_gbs)  # fmt: skip
    _measured_never(monkeypatch)
    assert lr.local_rates(shapes) == model
    assert measured_machine(spec).rates == model  # what bench --local and plan --local use


def test_a_changed_key_or_a_broken_file_is_measured_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _measured_canned(monkeypatch)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    one_thread = lr.local_rates()
    assert one_thread == parse_rates(CANNED) and len(calls) == 1
    assert lr.local_rates() == one_thread and len(calls) == 1
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # other rates: another file
    assert lr.local_rates() == one_thread and len(calls) == 2
    assert len(list(cache.glob("rates-*.json"))) == 2
    path = lr.rates_path(lr.rates_key())
    for broken in ("{ not json", "[" * 10_000, json.dumps({"key": lr.rates_key(), "rates": 5})):
        path.write_text(broken)
        assert lr.local_rates() == one_thread
    assert len(calls) == 5
    assert parse_rates(json.dumps(json.loads(path.read_text())["rates"])) == one_thread
    other = {**json.loads(path.read_text()), "key": {**lr.rates_key(), "host": "elsewhere"}}
    path.write_text(json.dumps(other))  # another machine's file under this name: not used
    assert lr.local_rates() == one_thread and len(calls) == 6


def test_a_failed_measurement_plans_without_rates_and_keeps_nothing(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(blas.CHOICE_ENV, "libnothing.so")  # the microbenchmark refuses it
    assert lr.local_rates() is None
    err = capsys.readouterr().err
    assert err.startswith("mlx-cluster: warning: could not measure this machine's rates (exit 1")
    assert blas.CHOICE_ENV in err and err.count("\n") == 1
    assert not list(cache.glob("rates-*"))


def test_plan_local_twice_measures_once(tmp_path: Path) -> None:
    env = {**os.environ, "MLX_CLUSTER_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}

    def plan() -> None:
        done = subprocess.run(
            [str(MLX_CLUSTER), "plan", "--local", "2", "--model", str(LLAMA), "--json"],
            capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode in (0, 1) and json.loads(done.stdout), done.stderr
        assert "warning" not in done.stderr

    plan()
    [kept] = (tmp_path / "cache").glob("rates-*.json")
    before = (kept.stat().st_mtime_ns, kept.read_text())
    plan()
    assert list((tmp_path / "cache").glob("rates-*")) == [kept]
    assert (kept.stat().st_mtime_ns, kept.read_text()) == before


def test_a_tensor_share_and_a_bfloat16_model_are_timed_on_their_own_matrices(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over 3 ranks each SmolLM2 rank multiplies by 3 of 9 heads, 1 of 3 KV heads and 512 of
    1,536 MLP columns (the head stays whole): those are timed, and kept apart from the whole
    model's. A bfloat16 model's are timed in bfloat16 (MLX's own kernel is slower on small
    matrices too); one rank or a quantized model has no share to time."""
    spec = spec_from_config(SMOLLM2)
    layer = ((576, 192), (576, 64), (576, 64), (192, 576), (576, 512), (576, 512), (512, 576))
    assert lr.layer_shapes(spec, 3) == (*((k, n, 30) for k, n in layer), (576, 49152, 1))
    assert lr.layer_shapes(spec, 2)[:2] == ((576, 320, 30), (576, 128, 30))  # rounded up
    huge = spec_from_config({**SMOLLM2, "hidden_size": 8192, "intermediate_size": 28672,
                             "num_attention_heads": 64, "num_key_value_heads": 8})  # fmt: skip
    assert lr.layer_shapes(huge) == ()  # beyond what the microbenchmark should hold
    bf16 = spec_from_config({**SMOLLM2, "torch_dtype": "bfloat16"})
    assert (spec.activation_dtype, bf16.activation_dtype) == ("float32", "bfloat16")
    assert lr.tensor_share_rates(spec, 1) is None
    generic = lr.local_rates()
    shares = lr.tensor_share_rates(spec, 3)
    brain = lr.local_rates(lr.layer_shapes(bf16), "bfloat16")
    assert generic is not None and shares is not None and brain is not None
    assert len(list(cache.glob("rates-*.json"))) == 3
    assert shares.matmul_gflops["float32"][1] != generic.matmul_gflops["float32"][1]
    assert brain.matmul_gflops["bfloat16"][1] != generic.matmul_gflops["bfloat16"][1]
    assert brain.matmul_gflops["float32"] == generic.matmul_gflops["float32"]
    _measured_never(monkeypatch)
    assert lr.tensor_share_rates(spec, 3) == shares
    assert measured_machine(bf16).rates == brain
