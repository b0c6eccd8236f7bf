"""`mlx-cluster tiny-model --family F` for the mixture-of-experts families (ministral3, qwen3_5):
folders mlx-lm loads like the family's real checkpoints, with the logits of the model that was
written, routers that pick different experts for different tokens, and any expert/head shape the
options ask for."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from cluster.tiny_model import (
    _HYBRID,
    _MLA,
    FAMILIES,
    MARKER,
    MOE_FAMILIES,
    TinySpec,
    _flat,
    _model_config,
    _random_model,
    write_tiny_model,
)
from topology.errors import InputError

CLI = Path(sys.executable).parent / "mlx-cluster"
# Families write_tiny_model writes that launcher/cli/tiny_model.py's --family does not offer yet
PROMPTS = (
    "Hello world",
    "Write a poem about the sea",
    "What is the capital of France?",
    "def main(): return 42",
    "The quick brown fox",
    "Numbers such as 7 and 2026",
)
# The keys each family's config.json must hold, at the default shape (4 layers, hidden 64,
# 4 heads, 8 experts, 2 per token, expert width 64)
EXPECTED: dict[str, dict[str, object]] = {
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "head_dim": 16,
        "tie_word_embeddings": False,
    },
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 2,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "num_key_value_heads": 4,
    },
    "glm4_moe": {
        "architectures": ["Glm4MoeForCausalLM"],
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "partial_rotary_factor": 0.5,
        "use_qk_norm": True,
        "attention_bias": True,
        "head_dim": 16,
    },
    "gpt_oss": {
        "architectures": ["GptOssForCausalLM"],
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 64,
        "sliding_window": 32,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "head_dim": 16,
    },
    "deepseek_v2": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "topk_method": "group_limited_greedy",
        "scoring_func": "softmax",
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "num_key_value_heads": 4,
    },
    "glm4_moe_lite": {
        "architectures": ["Glm4MoeLiteForCausalLM"],
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_method": "noaux_tc",
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "num_key_value_heads": 4,
    },
    "exaone_moe": {
        "architectures": ["ExaoneMoEForCausalLM"],
        "num_experts": 8,
        "num_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "is_moe_layer": [False, True, True, True],
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "sliding_window": 32,
        "head_dim": 16,
    },
    "deepseek_v32": {
        "architectures": ["DeepseekV32ForCausalLM"],
        "n_routed_experts": 8,
        "n_group": 2,
        "topk_method": "noaux_tc",
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 16,
    },
    "qwen3_5_moe": {  # read through text_config, as its multimodal checkpoints nest them
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "full_attention_interval": 2,
        "head_dim": 16,
        "tie_word_embeddings": False,
    },
    "minimax": {
        "architectures": ["MiniMaxM2ForCausalLM"],
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 64,
        "shared_intermediate_size": 0,
        "rotary_dim": 8,
        "use_qk_norm": True,
        "head_dim": 16,
    },
    "step3p5": {  # a full layer then three sliding ones, these with heads of their own
        "architectures": ["Step3p5ForCausalLM"],
        "num_attention_heads": 4,
        "num_attention_groups": 2,
        "attention_other_setting": {
            "attention_type": "sliding_attention",
            "num_attention_heads": 8,
            "num_attention_groups": 2,
            "head_dim": 16,
        },
        "layer_types": ["full_attention"] + ["sliding_attention"] * 3,
        "sliding_window": 32,
        "moe_num_experts": 8,
        "moe_top_k": 2,
        "moe_intermediate_size": 64,
        "share_expert_dim": 64,
        "moe_layers_enum": "1,2,3",
        "intermediate_size": 128,
        "num_key_value_heads": None,  # Step-3.5's files name them num_attention_groups
        "head_dim": 16,
    },
}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "tiny-model", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The family's default model, written by the CLI (once per family for this module)."""
    out = tmp_path_factory.mktemp(request.param) / "m"
    done = cli(str(out), "--family", request.param)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote a tiny {request.param} model (4 layers, hidden 64) to {out}\n"
    return out


def load(out: Path) -> tuple[nn.Module, Any]:
    from mlx_lm.utils import load as mlx_lm_load

    loaded = mlx_lm_load(str(out))  # typed as (model, tokenizer) or (model, tokenizer, config)
    return loaded[0], loaded[1]


def in_memory(out: Path) -> nn.Module:
    """The model the writer built, rebuilt in this process from its spec and config."""
    from mlx_lm.utils import quantize_model

    spec = TinySpec(**json.loads((out / MARKER).read_text()))
    config = json.loads((out / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    model = _random_model(spec, config)
    if spec.quantize_bits is not None:
        with contextlib.redirect_stdout(io.StringIO()):
            model, _ = quantize_model(model, config, spec.group_size, spec.quantize_bits)
    return model


def logits(model: nn.Module, tokenizer: Any, prompt: str) -> mx.array:
    out = model(mx.array(tokenizer.encode(prompt))[None])
    mx.eval(out)
    return out


def count(model: nn.Module) -> int:
    return sum(v.size for _, v in _flat(model.parameters()))


def test_written_model_loads_with_the_logits_of_the_model_built(written: Path) -> None:
    config = json.loads((written / "config.json").read_text())
    family = config["model_type"]
    assert ("text_config" in config) is (family in _HYBRID)
    flat = {**config.get("text_config", {}), **config}
    assert {k: flat.get(k) for k in EXPECTED[family]} == EXPECTED[family]
    assert ("head_dim" in flat) is (family not in _MLA)  # DeepSeek's file has none
    arch = importlib.import_module(f"mlx_lm.models.{family}")
    required = {
        f.name
        for f in dataclasses.fields(arch.ModelArgs)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert required <= config.keys()

    model, tokenizer = load(written)
    assert len(model.layers) == 4
    out = logits(model, tokenizer, PROMPTS[1])
    assert out.shape == (1, len(tokenizer.encode(PROMPTS[1])), flat["vocab_size"])
    assert mx.all(mx.isfinite(out)).item()
    np.testing.assert_allclose(out, logits(in_memory(written), tokenizer, PROMPTS[1]), atol=1e-5)
    spec = TinySpec(**json.loads((written / MARKER).read_text()))
    assert count(model) == spec.parameters()

    index = json.loads((written / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in written.glob("*.safetensors"))
    assert len(files) == 5 and set(index["weight_map"].values()) == set(files)
    for name, file in index["weight_map"].items():  # one file per layer, the rest in file 1
        layer = name.split("layers.")[1].split(".")[0] if "layers." in name else None
        assert file == files[0 if layer is None else int(layer) + 1], name


def test_different_prompts_give_different_tokens(written: Path) -> None:
    from mlx_lm import stream_generate

    model, tokenizer = load(written)
    firsts = {int(np.argmax(np.array(logits(model, tokenizer, p)[0, -1]))) for p in PROMPTS}
    assert len(firsts) >= 3, firsts
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPTS[1]}], add_generation_prompt=True
    )
    tokens = [r.token for r in stream_generate(model, tokenizer, ids, max_tokens=20)]
    assert len(tokens) >= 15 and len(set(tokens)) >= len(tokens) // 2, tokens


def test_routers_pick_different_experts_for_different_tokens(written: Path) -> None:
    model, tokenizer = load(written)
    family = json.loads((written / "config.json").read_text())["model_type"]
    name = "router" if family == "gpt_oss" else "gate"
    block = "block_sparse_moe" if family == "minimax" else "mlp"
    layer = next(x for x in model.layers if hasattr(x[block], name))  # the first MoE layer
    seen: list[Any] = []

    class Spy(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def __call__(self, x: mx.array) -> Any:
            out = self.inner(x)
            seen.append(out)
            return out

    setattr(layer[block], name, Spy(getattr(layer[block], name)))
    logits(model, tokenizer, "Write a short poem about the sea, the wind and the mountains")
    # DeepSeek-style gates return (experts, scores); the others return the router's logits
    picks = seen[0][0] if isinstance(seen[0], tuple) else mx.argsort(-seen[0], axis=-1)[..., :2]
    rows = [tuple(sorted(row)) for row in np.array(picks).reshape(-1, 2).tolist()]
    assert len(set(rows)) >= 4 and len({e for row in rows for e in row}) >= 4, rows


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_same_seed_same_weights(tmp_path: Path, family: str) -> None:
    a = write_tiny_model(tmp_path / "a", family, layers=2, seed=3)
    b = write_tiny_model(tmp_path / "b", family, layers=2, seed=3)
    c = write_tiny_model(tmp_path / "c", family, layers=2, seed=4)
    files = sorted(p.name for p in a.glob("*.safetensors"))
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert all((a / f).read_bytes() != (c / f).read_bytes() for f in files)


@pytest.mark.parametrize(
    ("family", "bits", "group"),
    [
        ("qwen3_moe", 4, 32),
        ("deepseek_v3", 8, 64),
        ("glm4_moe", 2, 32),
        ("gpt_oss", 6, 64),
        ("deepseek_v2", 4, 32),
        ("glm4_moe_lite", 8, 32),
        ("exaone_moe", 3, 64),
        ("deepseek_v32", 6, 32),
        ("qwen3_5_moe", 4, 64),
        ("minimax", 8, 32),
        ("step3p5", 4, 64),
    ],
)
def test_quantized_model_loads(tmp_path: Path, family: str, bits: int, group: int) -> None:
    out = write_tiny_model(tmp_path / "q", family, quantize_bits=bits, group_size=group)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["bits"] == bits
    assert config["quantization"]["group_size"] == group
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    experts = "experts" if family == "gpt_oss" else "switch_mlp"
    layer = "language_model.model.layers.3" if family in _HYBRID else "model.layers.3"
    mlp = f"{layer}.block_sparse_moe" if family == "minimax" else f"{layer}.mlp"
    assert f"{mlp}.{experts}.up_proj.scales" in index
    router = {"gpt_oss": "router", "step3p5": "gate.gate"}.get(family, "gate")
    if family in ("qwen3_moe", "gpt_oss", "qwen3_5_moe", "minimax", "step3p5"):  # 8 bits, g64
        entry = config["quantization"][f"{mlp}.{router}"]
        assert entry == {"group_size": 64, "bits": 8}
        assert f"{mlp}.{router}.scales" in index
    else:  # DeepSeek's MoEGate is no Linear: it stays unquantized
        assert f"{mlp}.{router}.weight" in index
        assert f"{mlp}.{router}.scales" not in index

    model, tokenizer = load(out)
    got = logits(model, tokenizer, PROMPTS[0])
    assert mx.all(mx.isfinite(got)).item()
    np.testing.assert_allclose(got, logits(in_memory(out), tokenizer, PROMPTS[0]), atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {"family": "qwen3_moe", "layers": 5, "dense_layers": 1, "sparse_step": 2, "experts": 6}
        | {"experts_per_token": 3, "head_dim": 24, "moe_intermediate": 40},
        {"family": "deepseek_v3", "heads": 3, "q_lora_rank": 0, "kv_lora_rank": 24}
        | {"qk_rope_dim": 6, "qk_nope_dim": 10, "v_head_dim": 12, "experts": 16}
        | {"experts_per_token": 4, "expert_groups": 4, "groups_per_token": 2, "dense_layers": 2},
        {"family": "glm4_moe", "head_dim": 32, "rotary_fraction": 0.25, "qk_norm": False}
        | {"shared_experts": 2, "dense_layers": 0, "expert_groups": 2, "groups_per_token": 2},
        {"family": "gpt_oss", "layers": 3, "heads": 8, "kv_heads": 2, "head_dim": 8}
        | {"sliding_window": 4, "experts": 4, "experts_per_token": 4},
        {"family": "deepseek_v2", "heads": 2, "q_lora_rank": 0, "kv_lora_rank": 24}
        | {"qk_rope_dim": 6, "qk_nope_dim": 10, "v_head_dim": 12, "expert_groups": 1},
        {"family": "exaone_moe", "layers": 5, "heads": 6, "kv_heads": 3, "head_dim": 8}
        | {"sliding_window": 4, "dense_layers": 2, "shared_experts": 2},
        {"family": "qwen3_5_moe", "layers": 5, "heads": 6, "kv_heads": 3, "head_dim": 8}
        | {"linear_key_heads": 3, "linear_value_heads": 9, "linear_key_head_dim": 8}
        | {"full_attention_interval": 3, "shared_experts": 2},
        {"family": "step3p5", "layers": 5, "heads": 6, "kv_heads": 3, "head_dim": 8}
        | {"other_heads": 9, "other_kv_heads": 3, "sliding_window": 4, "dense_layers": 2}
        | {"shared_experts": 2},
    ],
    ids=lambda options: options["family"],
)
def test_options_shape_the_model(tmp_path: Path, options: dict[str, Any]) -> None:
    out = write_tiny_model(tmp_path / "m", **options)
    config = json.loads((out / "config.json").read_text())
    spec = TinySpec(**json.loads((out / MARKER).read_text()))
    model, tokenizer = load(out)
    assert count(model) == spec.parameters()
    long_prompt = " ".join(PROMPTS)  # longer than gpt_oss's sliding window of 4
    got = logits(model, tokenizer, long_prompt)
    assert mx.all(mx.isfinite(got)).item()
    np.testing.assert_allclose(got, logits(in_memory(out), tokenizer, long_prompt), atol=1e-5)
    moe = [i for i, x in enumerate(model.layers) if hasattr(x.mlp, "switch_mlp")]
    family = options["family"]
    if family == "qwen3_moe":
        assert config["mlp_only_layers"] == [0] and config["decoder_sparse_step"] == 2
        assert moe == [1, 3]
    elif family == "deepseek_v3":
        assert config["q_lora_rank"] is None and "q_proj" in model.layers[0].self_attn
        assert moe == [2, 3] and config["n_group"] == 4 and config["topk_group"] == 2
    elif family == "glm4_moe":
        assert config["partial_rotary_factor"] == 0.25 and config["use_qk_norm"] is False
        assert moe == [0, 1, 2, 3] and model.layers[0].self_attn.rope.dims == 8
    elif family == "deepseek_v2":  # one group: DeepSeek-V2-Lite's plain greedy routing
        assert config["q_lora_rank"] is None and "q_proj" in model.layers[0].self_attn
        assert config["topk_method"] == "greedy" and moe == [1, 2, 3]
        assert model.layers[0].self_attn.kv_b_proj.weight.shape == (2 * (10 + 12), 24)
    elif family == "exaone_moe":
        assert config["is_moe_layer"] == [False, False, True, True, True] and moe == [2, 3, 4]
        caches = [type(c).__name__ for c in model.make_cache()]
        assert caches == ["RotatingKVCache"] * 3 + ["KVCache", "RotatingKVCache"]
        assert model.layers[2].mlp.shared_experts.up_proj.weight.shape == (128, 64)
    elif family == "qwen3_5_moe":  # every third layer full attention, every layer experts
        caches = [type(c).__name__ for c in model.make_cache()]
        assert caches == ["ArraysCache"] * 2 + ["KVCache"] + ["ArraysCache"] * 2
        assert moe == [0, 1, 2, 3, 4]
        linear = model.layers[0].linear_attn
        assert linear.in_proj_qkv.weight.shape == (2 * 3 * 8 + 9 * 8, 64)  # values: head size
        assert linear.in_proj_b.weight.shape == (9, 64)
        assert model.layers[2].self_attn.q_proj.weight.shape == (2 * 6 * 8, 64)  # + the gate
        assert model.layers[0].mlp.shared_expert.up_proj.weight.shape == (128, 64)
    elif family == "step3p5":  # layers 1-3 sliding, with 9 heads of 3 KV heads; 2-4 experts
        caches = [type(c).__name__ for c in model.make_cache()]
        assert caches == ["KVCache"] + ["RotatingKVCache"] * 3 + ["KVCache"]
        assert moe == [2, 3, 4] and config["moe_layers_enum"] == "2,3,4"
        full, sliding = model.layers[0].self_attn, model.layers[1].self_attn
        assert full.q_proj.weight.shape == (6 * 8, 64) and full.g_proj.weight.shape == (6, 64)
        assert sliding.q_proj.weight.shape == (9 * 8, 64) and sliding.g_proj.weight.shape == (9, 64)
        assert sliding.k_proj.weight.shape == (3 * 8, 64)
        assert model.layers[2].mlp.share_expert.up_proj.weight.shape == (128, 64)
    else:
        kinds = ["sliding_attention", "full_attention", "sliding_attention"]
        assert config["layer_types"] == kinds
        caches = [type(c).__name__ for c in model.make_cache()]
        assert caches == ["RotatingKVCache", "KVCache", "RotatingKVCache"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("hidden", [64, 96])
def test_parameters_counts_what_mlx_lm_builds(family: str, hidden: int) -> None:
    spec = TinySpec(family, layers=3, hidden=hidden, heads=4, kv_heads=2, vocab=300)
    arch = importlib.import_module(f"mlx_lm.models.{family}")
    model = arch.Model(arch.ModelArgs.from_dict(_model_config(spec, spec.vocab, eos=2)))
    assert count(model) == spec.parameters()  # the shapes alone: nothing is evaluated


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"family": "llama", "experts": 4}, "--experts does not apply to llama"),
        ({"family": "qwen2", "head_dim": 8}, "--head-dim does not apply to qwen2"),
        ({"family": "gpt_oss", "intermediate": 64}, "--intermediate does not apply to gpt_oss"),
        ({"family": "qwen3_moe", "shared_experts": 1}, "--shared-experts does not apply to"),
        ({"family": "glm4_moe", "q_lora_rank": 8}, "--q-lora-rank does not apply to glm4_moe"),
        ({"family": "qwen3_moe", "experts": 0}, "--experts must be at least 1 (got 0)"),
        ({"family": "deepseek_v3", "shared_experts": 0}, "--shared-experts must be at least 1"),
        ({"family": "deepseek_v3", "q_lora_rank": -1}, "--q-lora-rank must be at least 0"),
        (
            {"family": "qwen3_moe", "experts_per_token": 9},
            "--experts-per-token 9 must be at most --experts 8",
        ),
        (
            {"family": "qwen3_moe", "dense_layers": 4},
            "--dense-layers 4 and --sparse-step 1 leave no mixture-of-experts layer among 4",
        ),
        (
            {"family": "glm4_moe", "dense_layers": 4},
            "--dense-layers 4 must be less than --layers 4",
        ),
        ({"family": "deepseek_v3", "expert_groups": 3}, "--expert-groups 3 must divide"),
        ({"family": "deepseek_v3", "expert_groups": 8}, "leaves fewer than 2 of --experts 8"),
        (
            {"family": "deepseek_v3", "groups_per_token": 3},
            "--groups-per-token 3 must be at most --expert-groups 2",
        ),
        (
            {"family": "deepseek_v3", "experts_per_token": 5},
            "--groups-per-token 1 of --expert-groups 2 hold fewer than --experts-per-token 5",
        ),
        ({"family": "deepseek_v3", "qk_rope_dim": 5}, "--qk-rope-dim 5 must be even"),
        ({"family": "deepseek_v3", "layers": 62}, "--layers must be at most 61 for deepseek_v3"),
        ({"family": "deepseek_v32", "q_lora_rank": 0}, "--q-lora-rank must be at least 1 for"),
        ({"family": "deepseek_v2", "heads": 3}, "--heads 3 must divide --hidden 64 for"),
        ({"family": "gpt_oss", "layers": 1}, "--layers must be at least 2 for gpt_oss"),
        ({"family": "step3p5", "layers": 1, "dense_layers": 0}, "--layers must be at least 2 for"),
        ({"family": "llama", "other_heads": 8}, "--other-heads does not apply to llama"),
        (
            {"family": "step3p5", "other_heads": 5, "other_kv_heads": 2},
            "--other-kv-heads 2 must divide --other-heads 5",
        ),
        ({"family": "step3p5", "head_dim": 6}, "gives 3 rotary dimensions"),
        ({"family": "glm4_moe", "rotary_fraction": 0.1}, "gives 1 rotary dimensions"),
        ({"family": "glm4_moe", "rotary_fraction": 1.5}, "--rotary-fraction must be in (0, 1]"),
        ({"family": "qwen3", "head_dim": 7}, "--head-dim must be even"),
        (
            {"family": "qwen3_5", "linear_key_heads": 2, "linear_value_heads": 3},
            "--linear-value-heads 3 must be a multiple of --linear-key-heads 2",
        ),
        ({"family": "qwen3_5", "full_attention_interval": 5}, "must be from 2 to --layers 4"),
        ({"family": "qwen3_5", "full_attention_interval": 1}, "a linear and a full-attention"),
        ({"family": "qwen3_5", "head_dim": 12}, "gives 3 rotary dimensions"),
        ({"family": "qwen3", "linear_key_heads": 2}, "--linear-key-heads does not apply to"),
        ({"family": "minimax", "intermediate": 64}, "--intermediate does not apply to minimax"),
        ({"family": "minimax", "rotary_fraction": 0.1}, "gives 1 rotary dimensions"),
        (
            {"family": "gpt_oss", "hidden": 96, "heads": 4, "quantize_bits": 4},
            "--hidden 96 must be a multiple of 64 to quantize gpt_oss",
        ),
        (
            {"family": "qwen3_moe", "layers": 64, "hidden": 4096, "experts": 128},
            "parameters; a tiny model has at most",
        ),
    ],
)
def test_check_names_the_bad_option_in_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as raised:
        TinySpec(**options).check()
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_odd_head_shapes_are_fine_where_heads_need_not_divide_hidden() -> None:
    TinySpec("deepseek_v3", hidden=64, heads=3, kv_heads=2).check()  # MLA: no kv heads
    TinySpec("qwen3_moe", hidden=64, heads=6, kv_heads=3, head_dim=8).check()


def test_cli_offers_every_family_and_refuses_a_foreign_option(tmp_path: Path) -> None:
    from launcher.cli import tiny_model as command

    assert FAMILIES == command.FAMILIES
    done = cli(str(tmp_path / "m"), "--family", "llama", "--sliding-window", "8")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("mlx-cluster: error: --sliding-window does not apply to llama")
    assert not (tmp_path / "m").exists()


def test_ministral3_loads_with_the_logits_of_the_model_built(tmp_path: Path) -> None:
    """A dense family with Llama 4's query scale, which grows past
    original_max_position_embeddings: a prompt longer than that is scaled, and still matches."""
    out = write_tiny_model(tmp_path / "m", "ministral3", heads=8, kv_heads=4, head_dim=8)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Ministral3ForCausalLM"]
    rope = config["rope_parameters"]
    assert rope["rope_type"] == "yarn" and rope["llama_4_scaling_beta"] == 0.1
    model, tokenizer = load(out)
    spec = TinySpec(**json.loads((out / MARKER).read_text()))
    assert count(model) == spec.parameters()
    long_prompt = " ".join(PROMPTS) * 12
    assert len(tokenizer.encode(long_prompt)) > rope["original_max_position_embeddings"]
    got = logits(model, tokenizer, long_prompt)
    assert mx.all(mx.isfinite(got)).item()
    np.testing.assert_allclose(got, logits(in_memory(out), tokenizer, long_prompt), atol=1e-5)


def test_qwen3_5_loads_with_the_logits_of_the_model_built(tmp_path: Path) -> None:
    """Dense Qwen3.5: gated delta net layers (3 key heads of 2 value heads each) with a gated
    full-attention layer every second one, the embeddings tied, its settings in text_config."""
    out = write_tiny_model(
        tmp_path / "m", "qwen3_5", heads=8, kv_heads=2, linear_key_heads=3, linear_value_heads=6
    )
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    text = config["text_config"]
    assert (text["model_type"], text["full_attention_interval"]) == ("qwen3_5_text", 2)
    assert text["tie_word_embeddings"] is True and "lm_head" not in load(out)[0].language_model
    model, tokenizer = load(out)
    caches = [type(c).__name__ for c in model.make_cache()]
    assert caches == ["ArraysCache", "KVCache"] * 2
    spec = TinySpec(**json.loads((out / MARKER).read_text()))
    assert count(model) == spec.parameters()
    got = logits(model, tokenizer, " ".join(PROMPTS))
    assert mx.all(mx.isfinite(got)).item()
    np.testing.assert_allclose(got, logits(in_memory(out), tokenizer, " ".join(PROMPTS)), atol=1e-5)
