#!/usr/bin/env python3
"""Decode-speed prediction vs published figures: prints the calibration table and the fit.

Usage: .venv/bin/python scripts/calibrate_prediction.py

Published figures (all on Mac Studio M3 Ultra 512 GB, decode tok/s):
- exo 1.0 over RDMA (jaccl, tensor parallel) at 1/2/4 nodes: Qwen3 235B-A22B 8-bit
  19.5/26.2/31.9; DeepSeek V3.1 21.1/27.8/32.5 (4-bit assumed: 8-bit would not fit one node);
  Kimi K2 Thinking -/21.6/28.3 (held out of the fit).
- llama.cpp over TCP (layer split, a different engine) on the same Macs: Qwen3 20.4/17.2/15.2.
- RDMA vs TCP on the same cable: 28.6 vs 6.6 tok/s (oMLX #3037; model not stated, compared
  as a ratio on Qwen3 235B 8-bit over 2 nodes).
Fitted: the decode bandwidth efficiency from the 1-node rows, the per-step overhead of a
distributed step (base + per extra rank) from the 2- and 4-node exo rows of Qwen3 and DeepSeek.

Prefill (prompt tok/s on one Mac, the chip table's assumed compute; prefill_rows()):
- mlx-lm, Llama 3.3 70B 4-bit on an M3 Max 64 GB (40-core GPU), prompts of 689 to 30,136
  tokens: 83.6 ... 58.1 tok/s (https://github.com/ml-explore/mlx-examples/issues/1029). The
  689-token row sets the q4 efficiency (chips.PREFILL_MATMUL_EFFICIENCY); the longer prompts
  are held out (how the prediction scales with the prompt).
- mlx-lm, Mistral 7B 4-bit on an M2 Ultra (192 GB: 76 cores), a 33,898-token prompt: 869 tok/s
  (https://github.com/ml-explore/mlx-lm/pull/40). Held out (M2's bfloat16, a long prompt).
- Rapid-MLX on mlx 0.31.2, Phi-4-mini 4-bit on an M3 Ultra 256 GB (60 cores), 512 tokens:
  2,197 tok/s (https://github.com/raullenchai/Rapid-MLX/pull/585). Held out.
- llama.cpp pp512 of LLaMA-2 7B F16 per chip and GPU core count
  (https://github.com/ggml-org/llama.cpp/discussions/4167): another engine, so only the shape
  of the peak table (cores x clock) is checked: one ratio is fitted to the M2 Ultra 76-core row,
  every other chip is held out.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topology import chips  # noqa: E402
from topology.chips import BACKENDS  # noqa: E402
from topology.facts import HostFacts  # noqa: E402
from topology.model.spec import ModelSpec, spec_from_config  # noqa: E402
from topology.planning.plan import plan_local  # noqa: E402
from topology.planning.predict import (  # noqa: E402
    pipeline_seconds,
    stage_flops,
    tensor_seconds,
)
from topology.planning.tensor_costs import rank_costs, tensor_layout  # noqa: E402

M3_ULTRA_GBS = 819.0
CONTEXT = 512  # the published runs used short prompts; the KV cache barely matters here
MODELS = ROOT / "tests" / "fixtures" / "models"


def _spec(name: str) -> ModelSpec:
    config = json.loads((MODELS / name / "config.json").read_text())
    return spec_from_config(config, source=name)


def specs() -> dict[str, ModelSpec]:
    qwen = _spec("qwen3-235b-a22b-4bit")
    deepseek = _spec("deepseek-v3-4bit")  # V3.1 has V3's architecture
    # Kimi K2: DeepSeek V3's architecture with 384 experts, 64 heads, one dense layer and a
    # 163840 vocabulary (its public config.json); 4-bit with group 32, like its INT4 release.
    kimi = dataclasses.replace(
        deepseek, source="kimi-k2", heads=64, kv_heads=64, experts=384, vocab=163840,
        sparse_layers=tuple(range(1, 61)), group_size=32,
    )  # fmt: skip
    return {
        "Qwen3 235B 8-bit": dataclasses.replace(qwen, bits=8, source="qwen3-235b-8bit"),
        "DeepSeek V3.1 4-bit": deepseek,
        "Kimi K2 4-bit": kimi,
    }


def tensor_tok_s(spec: ModelSpec, n: int, backend: str = "jaccl") -> float:
    lay = tensor_layout(spec, [1.0] * n, CONTEXT)  # equal Macs: equal shares
    assert not isinstance(lay, str), lay
    costs = rank_costs(spec, lay, CONTEXT)
    seconds, _ = tensor_seconds(spec, costs, [M3_ULTRA_GBS] * n, BACKENDS[backend])
    return 1 / seconds


def pipeline_tok_s(spec: ModelSpec, n: int, backend: str = "ring") -> float:
    per = spec.layers // n
    stages = [
        (spec.layers - per * (r + 1) if r < n - 1 else 0, spec.layers - per * r) for r in range(n)
    ]
    seconds, _ = pipeline_seconds(spec, stages, [M3_ULTRA_GBS] * n, BACKENDS[backend], CONTEXT)
    return 1 / seconds


EXO = {
    "Qwen3 235B 8-bit": {1: 19.5, 2: 26.2, 4: 31.9},
    "DeepSeek V3.1 4-bit": {1: 21.1, 2: 27.8, 4: 32.5},
    "Kimi K2 4-bit": {2: 21.6, 4: 28.3},
}
FITTED = ("Qwen3 235B 8-bit", "DeepSeek V3.1 4-bit")


def rows() -> list[tuple[str, str, float, float]]:
    s = specs()
    out = []
    for name, figures in EXO.items():
        tag = "" if name in FITTED else " (held out)"
        for n, published in figures.items():
            out.append(
                (f"exo {name}{tag}", f"tensor ×{n} jaccl", published, tensor_tok_s(s[name], n))
            )
    qwen = s["Qwen3 235B 8-bit"]
    for n, published in {2: 17.2, 4: 15.2}.items():
        # llama.cpp is another engine: compare its slowdown vs its own 1 node with ours.
        scaled = 20.4 * pipeline_tok_s(qwen, n) / tensor_tok_s(qwen, 1)
        out.append(("llama.cpp Qwen3 (vs its 1 node)", f"pipeline ×{n} TCP", published, scaled))
    ratio = tensor_tok_s(qwen, 2) / tensor_tok_s(qwen, 2, "ring")
    out.append(("oMLX RDMA/TCP ratio (Qwen3 ×2)", "tensor ×2", 28.6 / 6.6, ratio))
    return out


def _grid(loss: Callable[[float, float], float]) -> tuple[float, float]:
    best = min(
        ((loss(b * 1e-4, p * 1e-4), b, p) for b in range(0, 150) for p in range(0, 80)),
        key=lambda t: t[0],
    )
    return best[1] * 1e-4, best[2] * 1e-4


def refit() -> tuple[float, float, float]:
    """Refit efficiency and step overhead from the published rows (checks chips.py's values)."""
    s = specs()
    # One node has no step overhead and tok/s is proportional to the efficiency.
    ones = [(s[name], EXO[name][1]) for name in FITTED]
    eff = chips.DECODE_BANDWIDTH_EFFICIENCY
    eff *= sum(published / tensor_tok_s(spec, 1) for spec, published in ones) / len(ones)
    # Seconds per token without the step overhead, for each multi-node published row.
    points = [
        (1 / tensor_tok_s(s[name], n) - chips.step_overhead_s(n), n, EXO[name][n])
        for name in FITTED
        for n in (2, 4)
    ]

    def loss(base: float, per_rank: float) -> float:
        return sum(
            ((1 / (t + base + per_rank * (n - 1)) - published) / published) ** 2
            for t, n, published in points
        )

    base, per_rank = _grid(loss)
    return eff, base, per_rank


def _llama(name: str, **cfg: Any) -> ModelSpec:
    """A llama-shaped spec from the public config.json figures of a model not in the fixtures."""
    config = {"model_type": "llama", "torch_dtype": "bfloat16", **cfg}
    return spec_from_config(config, source=name)


def prefill_specs() -> dict[str, ModelSpec]:
    llama70 = _spec("llama-3.3-70b-instruct-bf16")
    q4 = {"bits": 4, "group_size": 64}
    return {
        "Llama 3.3 70B 4-bit": dataclasses.replace(llama70, **q4, source="llama-3.3-70b-4bit"),
        # Mistral-7B-Instruct-v0.3's config.json; 4-bit as mlx-community quantizes it
        "Mistral 7B 4-bit": dataclasses.replace(
            _llama(
                "mistral-7b",
                hidden_size=4096,
                intermediate_size=14336,
                num_attention_heads=32,
                num_key_value_heads=8,
                num_hidden_layers=32,
                vocab_size=32768,
            ),
            **q4,
        ),
        # Phi-4-mini-instruct's config.json (phi3: fused qkv and gate_up, the same weights)
        "Phi-4-mini 4-bit": dataclasses.replace(
            _llama(
                "phi-4-mini",
                hidden_size=3072,
                intermediate_size=8192,
                num_attention_heads=24,
                num_key_value_heads=8,
                num_hidden_layers=32,
                vocab_size=200064,
                tie_word_embeddings=True,
            ),
            **q4,
        ),
        # LLaMA-2 7B (llama.cpp's benchmark model), float16
        "LLaMA-2 7B F16": _llama(
            "llama-2-7b",
            hidden_size=4096,
            intermediate_size=11008,
            num_attention_heads=32,
            num_hidden_layers=32,
            vocab_size=32000,
            torch_dtype="float16",
        ),
    }


# (model, chip as sysctl names it, memory GB, prompt tokens, published prompt tok/s, source)
MLX_PREFILL = [
    ("Llama 3.3 70B 4-bit", "Apple M3 Max", 64, 689, 83.567, "mlx-examples #1029"),
    ("Llama 3.3 70B 4-bit", "Apple M3 Max", 64, 4126, 79.410, "mlx-examples #1029"),
    ("Llama 3.3 70B 4-bit", "Apple M3 Max", 64, 16003, 67.948, "mlx-examples #1029"),
    ("Llama 3.3 70B 4-bit", "Apple M3 Max", 64, 30136, 58.080, "mlx-examples #1029"),
    ("Mistral 7B 4-bit", "Apple M2 Ultra", 192, 33898, 869.279, "mlx-lm #40"),
    ("Phi-4-mini 4-bit", "Apple M3 Ultra", 256, 512, 2197.19, "Rapid-MLX #585"),
]
PREFILL_FIT = 0  # the row that sets the q4 efficiency
# llama.cpp pp512, LLaMA-2 7B F16 (discussion #4167): (chip, GPU cores, tok/s)
LLAMA_CPP_F16 = [
    ("M1 Max", 32, 599.53), ("M1 Ultra", 48, 875.81), ("M1 Ultra", 64, 1168.89),
    ("M2 Max", 38, 755.67), ("M2 Ultra", 60, 1128.59), ("M2 Ultra", 76, 1401.85),
    ("M3 Max", 40, 779.17), ("M3 Ultra", 60, 1121.80), ("M3 Ultra", 80, 1538.34),
    ("M4", 10, 230.18), ("M4 Pro", 20, 464.48), ("M4 Max", 40, 922.83),
]  # fmt: skip
LLAMA_CPP_FIT = ("M2 Ultra", 76)


def mlx_prefill_tok_s(spec: ModelSpec, chip: str, memory_gb: int, prompt: int) -> float:
    """The planner's prompt tok/s for one rank on a Mac never measured (chip table rates)."""
    host = HostFacts(name="mac", chip=chip, memory_bytes=memory_gb * chips.GIB)
    plan = plan_local(host, 1, spec, context=max(prompt, 512), prompt_tokens=prompt)
    return plan.predicted_prefill_tok_s or 0.0


def _flops_per_token(spec: ModelSpec, context: int) -> float:
    """The planner's FLOPs a prompt token at this context (its layers and the LM head)."""
    head = 2 * spec.outside_layers_active_bytes / (spec.param_bytes(spec.bits) * spec.scale)
    return sum(stage_flops(spec, (0, spec.layers), context)) + head


def prefill_rows() -> list[tuple[str, str, float, float]]:
    s = prefill_specs()
    out = []
    for i, (name, chip, gb, prompt, published, source) in enumerate(MLX_PREFILL):
        tag = " (fit)" if i == PREFILL_FIT else ""
        setup = f"{chips.chip_key(chip)} {gb} GB, {prompt:,} tok"
        predicted = mlx_prefill_tok_s(s[name], chip, gb, prompt)
        out.append((f"{source} {name}{tag}", setup, published, predicted))
    llama = s["LLaMA-2 7B F16"]
    flops = _flops_per_token(llama, 512)

    def peak(key: str, cores: int) -> float:
        return chips.gpu_bin(key, cores).peak_tflops * 1e12

    ratio = dict(((k, c), t) for k, c, t in LLAMA_CPP_F16)[LLAMA_CPP_FIT] * flops
    ratio /= peak(*LLAMA_CPP_FIT)
    for key, cores, published in LLAMA_CPP_F16:
        tag = " (fit)" if (key, cores) == LLAMA_CPP_FIT else ""
        predicted = peak(key, cores) * ratio / flops
        out.append(
            (f"llama.cpp pp512 LLaMA-2 7B F16{tag}", f"{key} {cores}c", published, predicted)
        )
    return out


def refit_prefill() -> float:
    """The q4 efficiency that would make the fit row exact."""
    name, chip, gb, prompt, published, _ = MLX_PREFILL[PREFILL_FIT]
    predicted = mlx_prefill_tok_s(prefill_specs()[name], chip, gb, prompt)
    return chips.PREFILL_MATMUL_EFFICIENCY["q4"] * published / predicted


def _print(rows: list[tuple[str, str, float, float]]) -> None:
    for what, setup, published, predicted in rows:
        err = (predicted - published) / published * 100
        print(f"{what:<42} {setup:<24} {published:>9.1f} {predicted:>9.1f} {err:>+6.1f}%")


def main() -> int:
    print(f"{'published run':<42} {'setup':<18} {'published':>9} {'predicted':>9} {'error':>7}")
    for what, setup, published, predicted in rows():
        err = (predicted - published) / published * 100
        print(f"{what:<42} {setup:<18} {published:>9.1f} {predicted:>9.1f} {err:>+6.1f}%")
    eff, base, per_rank = refit()
    print()
    print("constants (topology/chips.py)        in use     refit from the published rows")
    table = [
        ("decode bandwidth efficiency", chips.DECODE_BANDWIDTH_EFFICIENCY, eff, "{:.3f}"),
        ("step overhead, base (ms)", chips.STEP_OVERHEAD_S * 1e3, base * 1e3, "{:.1f}"),
        (
            "step overhead per extra rank (ms)",
            chips.STEP_OVERHEAD_PER_RANK_S * 1e3,
            per_rank * 1e3,
            "{:.1f}",
        ),
    ]
    for label, in_use, fitted, fmt in table:
        print(f"  {label:<34} {fmt.format(in_use):<10} {fmt.format(fitted)}")
    print()
    print("Prefill, prompt tok/s on one Mac (chip table compute, not measured):")
    print(f"{'published run':<42} {'setup':<24} {'published':>9} {'predicted':>9} {'error':>7}")
    _print(prefill_rows())
    q4 = chips.PREFILL_MATMUL_EFFICIENCY["q4"]
    print(f"  {'prefill q4 matmul efficiency':<34} {q4:<10.3f} {refit_prefill():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
