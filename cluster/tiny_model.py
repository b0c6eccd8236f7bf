"""A tiny random-weight model that mlx-lm loads like a real checkpoint, built offline.

Dense families (llama, qwen2, qwen3, ministral3, qwen3_5) and mixture-of-experts ones (qwen3_moe,
deepseek_v3, deepseek_v32, deepseek_v2 and glm4_moe_lite with MLA attention, glm4_moe, gpt_oss,
exaone_moe, qwen3_5_moe, minimax, step3p5), each with config.json keyed as the family's Hugging Face
checkpoints are and the parameter names mlx-lm's model class has (its sanitize() keeps them).
Qwen3.5's two (gated delta net linear attention, every full_attention_interval-th layer gated
full attention) nest the decoder's settings in text_config, as its multimodal checkpoints do.

Weights are split one file per layer (plus one for embeddings/norm/head) with a
model.safetensors.index.json, so pipeline ranks can be shown to read only their layers'
files. The tokenizer is a small byte-level BPE trained on a built-in text with the
`tokenizers` library, with a chat template and an end-of-turn token. Everything is written
into a temporary directory beside the target and renamed into place: a failure leaves nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from cluster.model_folder import save_weights_by_layer, write_folder
from topology.errors import InputError

DENSE_FAMILIES = ("llama", "qwen2", "qwen3", "ministral3", "qwen3_5")
MOE_FAMILIES = (
    "qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss", "deepseek_v2", "glm4_moe_lite", "exaone_moe",
    "deepseek_v32", "qwen3_5_moe", "minimax", "step3p5",
)  # fmt: skip
FAMILIES = DENSE_FAMILIES + MOE_FAMILIES
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
    "exaone_moe": "ExaoneMoEForCausalLM",
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "minimax": "MiniMaxM2ForCausalLM",
    "step3p5": "Step3p5ForCausalLM",
}
# DeepSeek-style experts: a gate over groups of experts, shared experts, the first layers dense
_ROUTED = ("deepseek_v3", "glm4_moe", "deepseek_v2", "glm4_moe_lite", "exaone_moe", "deepseek_v32")
_MLA = ("deepseek_v3", "deepseek_v2", "glm4_moe_lite", "deepseek_v32")  # latent: no KV heads
_HYBRID = ("qwen3_5", "qwen3_5_moe")  # linear attention beside gated full attention
QWEN3_5_ROTARY = 0.25  # Qwen3.5's partial_rotary_factor
STEP3P5_ROTARY = 0.5  # Step-3.5's partial rotary factor on its full-attention layers
STEP3P5_FULL_EVERY = 4  # Step-3.5-Flash: a full-attention layer, then three sliding ones
LINEAR_CONV = 4  # its linear_conv_kernel_dim
# DeepSeek-V3.2's indexer, which picks the context a token attends to: heads, their size (a
# multiple of the rope part: 2x it) and how many tokens it keeps, few so that tests pass beyond
INDEX_HEADS, INDEX_TOPK = 2, 16
# The options only some families read, and those families: given to another one, an option is
# refused rather than silently ignored.
APPLIES: dict[str, tuple[str, ...]] = {
    # gpt-oss and MiniMax have experts only
    "intermediate": tuple(f for f in FAMILIES if f not in ("gpt_oss", "minimax")),
    "head_dim": tuple(f for f in FAMILIES if f not in ("qwen2", *_MLA)),
    "experts": MOE_FAMILIES,
    "experts_per_token": MOE_FAMILIES,
    "moe_intermediate": MOE_FAMILIES,
    "shared_experts": (*_ROUTED, "qwen3_5_moe", "step3p5"),
    "dense_layers": ("qwen3_moe", *_ROUTED, "step3p5"),
    "sparse_step": ("qwen3_moe",),
    "expert_groups": _ROUTED,
    "groups_per_token": _ROUTED,
    "q_lora_rank": _MLA,
    "kv_lora_rank": _MLA,
    "qk_rope_dim": _MLA,
    "qk_nope_dim": _MLA,
    "v_head_dim": _MLA,
    "rotary_fraction": ("glm4_moe", "minimax"),
    "qk_norm": ("glm4_moe", "minimax"),
    "sliding_window": ("gpt_oss", "exaone_moe", "step3p5"),
    "other_heads": ("step3p5",),
    "other_kv_heads": ("step3p5",),
    "linear_key_heads": _HYBRID,
    "linear_value_heads": _HYBRID,
    "linear_key_head_dim": _HYBRID,
    "linear_value_head_dim": _HYBRID,
    "full_attention_interval": _HYBRID,
}
POSITIVE_OPTIONS = (
    "intermediate", "head_dim", "experts", "experts_per_token", "moe_intermediate", "sparse_step",
    "shared_experts", "expert_groups", "groups_per_token", "kv_lora_rank", "qk_rope_dim",
    "qk_nope_dim", "v_head_dim", "sliding_window", "linear_key_heads", "linear_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "full_attention_interval", "other_heads",
    "other_kv_heads",
)  # fmt: skip
DEEPSEEK_MAX_LAYERS = 61  # its sanitize() drops "model.layers.61*", DeepSeek-V3's MTP layer
ROUTER_GROUP = 64  # the MoE families' quant_predicate: routers at 8 bits, groups of 64
CONTEXT = 4096  # max_position_embeddings, as the tokenizer's model_max_length
# Scaled-down YaRN as DeepSeek-V3 and gpt-oss ship it (factor 40 / 32 over 4096 there)
YARN = {
    "factor": 4.0,
    "original_max_position_embeddings": CONTEXT // 4,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}
QUANT_BITS = (2, 3, 4, 6, 8)
T = TypeVar("T")
MARKER = "mlx-cluster-tiny-model.json"  # this directory is ours to overwrite
MAX_PARAMETERS = 1 << 31  # 8 GiB of float32: beyond that the model is not tiny (and RAM runs out)
EOS, PAD, TURN = "<|im_end|>", "<|endoftext|>", "<|im_start|>"
# A ChatML template with tools in the common "hermes" shape: the tool list in the system turn,
# calls as <tool_call>{"name", "arguments"}</tool_call>, results as <tool_response> in a user
# turn. mlx-lm recognises the shape and parses calls with its json_tools parser.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "You may call these functions:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'To call one, answer <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if tools and loop.first and m['role'] == 'system' %}"
    "{% elif m['role'] == 'assistant' and m['tool_calls'] %}<|im_start|>assistant\n"
    "{% if m['content'] %}{{ m['content'] }}\n{% endif %}"
    "{% for call in m['tool_calls'] %}{% set tool_call = call['function'] %}<tool_call>\n"
    '{"name": "{{ tool_call.name }}", "arguments": '
    "{% if tool_call.arguments is string %}{{ tool_call.arguments }}"
    "{% else %}{{ tool_call.arguments | tojson }}{% endif %}}\n</tool_call>\n"
    "{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Training text for the tokenizer (our own words): enough variety for a few hundred merges.
CORPUS = """\
A cluster of small computers can act as one large machine when the cables between them are fast.
Each computer holds a slice of the model, computes its part of every token, and shares the result.
Tensor parallel splits every layer across the machines; pipeline parallel gives each one a run of
layers and passes the hidden state along. The first token takes longest because the prompt is read
in full. After that, decoding is limited by how quickly memory can be read, one token at a time.
Hello world! What is the capital of France? Paris is the capital of France, and Rome of Italy.
Write a short poem about the sea, the wind, the mountains and the quiet light of the morning.
Numbers such as 0 1 2 3 4 5 6 7 8 9 10 42 100 and 2026 appear in code, dates and measurements.
def main(): return sum(x * x for x in range(10))  # a line of Python for the tokenizer to see
The quick brown fox jumps over the lazy dog while the cat sleeps near the warm window.
"""


@dataclass(frozen=True)
class Shape:
    """Every size of the model with the family's defaults filled in (TinySpec.shape())."""

    head_dim: int
    intermediate: int  # the dense MLP's width
    experts: int
    experts_per_token: int
    moe_intermediate: int  # one expert's width
    shared_experts: int
    dense_layers: int  # the first layers with a dense MLP instead of experts
    sparse_step: int
    expert_groups: int
    groups_per_token: int
    q_lora_rank: int  # 0: queries without the low-rank projection
    kv_lora_rank: int
    qk_rope_dim: int
    qk_nope_dim: int
    v_head_dim: int
    rotary_fraction: float
    qk_norm: bool
    sliding_window: int
    linear_key_heads: int
    linear_value_heads: int  # a multiple of linear_key_heads: each key head's group
    linear_key_head_dim: int
    linear_value_head_dim: int
    full_attention_interval: int  # every Nth layer full attention, the others linear
    other_heads: int  # Step-3.5's sliding layers: their own query heads
    other_kv_heads: int  # ... and KV heads


@dataclass(frozen=True)
class TinySpec:
    """What to build; None is the family's default (see shape()). The options after `seed`
    apply to some families only, and check() refuses them for the others."""

    family: str = "llama"
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2  # MLA (the DeepSeeks, glm4_moe_lite) has none: it writes kv heads = heads
    intermediate: int | None = None
    vocab: int = 384
    quantize_bits: int | None = None
    group_size: int = 32
    seed: int = 0
    head_dim: int | None = None
    experts: int | None = None
    experts_per_token: int | None = None
    moe_intermediate: int | None = None
    shared_experts: int | None = None
    dense_layers: int | None = None
    sparse_step: int | None = None
    expert_groups: int | None = None
    groups_per_token: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_dim: int | None = None
    qk_nope_dim: int | None = None
    v_head_dim: int | None = None
    rotary_fraction: float | None = None
    qk_norm: bool | None = None
    sliding_window: int | None = None
    linear_key_heads: int | None = None
    linear_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    full_attention_interval: int | None = None
    other_heads: int | None = None
    other_kv_heads: int | None = None

    def shape(self) -> Shape:
        """The sizes to build, defaults filled in: small, and every feature of the family on."""
        head = self.hidden // self.heads
        mla = max(2, head // 2 * 2)  # DeepSeek's latent sizes scale with the head size
        deepseek = self.family in ("deepseek_v3", "deepseek_v2", "deepseek_v32")
        keys = _given(self.linear_key_heads, 2)  # Qwen3.5's linear attention: 2 value heads each
        return Shape(
            head_dim=_given(self.head_dim, head),
            intermediate=_given(self.intermediate, 2 * self.hidden),
            experts=_given(self.experts, 8),
            experts_per_token=_given(self.experts_per_token, 2),
            moe_intermediate=_given(self.moe_intermediate, 64),
            shared_experts=_given(self.shared_experts, 1),
            dense_layers=_given(self.dense_layers, 0 if self.family == "qwen3_moe" else 1),
            sparse_step=_given(self.sparse_step, 1),
            expert_groups=_given(self.expert_groups, 2 if deepseek else 1),
            groups_per_token=_given(self.groups_per_token, 1),
            q_lora_rank=_given(self.q_lora_rank, 3 * mla),
            kv_lora_rank=_given(self.kv_lora_rank, 2 * mla),
            qk_rope_dim=_given(self.qk_rope_dim, max(2, mla // 4 * 2)),
            qk_nope_dim=_given(self.qk_nope_dim, mla),
            v_head_dim=_given(self.v_head_dim, mla),
            rotary_fraction=_given(self.rotary_fraction, 0.5),
            qk_norm=_given(self.qk_norm, True),
            sliding_window=_given(self.sliding_window, 32),
            linear_key_heads=keys,
            linear_value_heads=_given(self.linear_value_heads, 2 * keys),
            linear_key_head_dim=_given(self.linear_key_head_dim, _given(self.head_dim, head)),
            linear_value_head_dim=_given(self.linear_value_head_dim, _given(self.head_dim, head)),
            full_attention_interval=_given(self.full_attention_interval, 2),
            other_heads=_given(self.other_heads, 2 * self.heads),
            other_kv_heads=_given(self.other_kv_heads, self.kv_heads),
        )

    def check(self) -> None:
        """Raise InputError naming the first bad value and what would work."""
        self._check_ranges()
        if self.family not in FAMILIES:
            raise InputError(f"unknown family {self.family!r}: use one of {', '.join(FAMILIES)}")
        for name, families in APPLIES.items():
            if getattr(self, name) is not None and self.family not in families:
                raise InputError(
                    f"--{_flag(name)} does not apply to {self.family} "
                    f"(only to {', '.join(families)})"
                )
        s = self.shape()
        self._check_heads(s)
        if self.family in _HYBRID:
            self._check_linear(s)
        if self.family in MOE_FAMILIES:
            self._check_experts(s)
        if self.family == "deepseek_v32" and not s.q_lora_rank:
            raise InputError(  # its indexer reads the queries' low-rank projection
                "--q-lora-rank must be at least 1 for deepseek_v32"
            )
        if self.family == "deepseek_v3" and self.layers > DEEPSEEK_MAX_LAYERS:
            raise InputError(
                f"--layers must be at most {DEEPSEEK_MAX_LAYERS} for deepseek_v3 (got "
                f"{self.layers}): mlx-lm drops layer {DEEPSEEK_MAX_LAYERS} as DeepSeek-V3's "
                "multi-token-prediction layer"
            )
        if self.family in ("gpt_oss", "step3p5") and self.layers < 2:
            raise InputError(
                f"--layers must be at least 2 for {self.family} (a sliding and a full one)"
            )
        if not 300 <= self.vocab <= 4096:
            raise InputError(f"--vocab must be between 300 and 4096 (got {self.vocab})")
        if (n := self.parameters()) > MAX_PARAMETERS:
            experts = ", --experts" if self.family in MOE_FAMILIES else ""
            raise InputError(
                f"these sizes give {n:,} parameters; a tiny model has at most "
                f"{MAX_PARAMETERS:,}: make --layers, --hidden{experts} or a width smaller"
            )
        if self.quantize_bits is not None:
            self._check_quantization()

    def _check_ranges(self) -> None:
        positive = {"layers": self.layers, "hidden": self.hidden, "heads": self.heads}
        positive |= {"kv_heads": self.kv_heads}
        for name in POSITIVE_OPTIONS:
            if (value := getattr(self, name)) is not None:
                positive[name] = value
        for name, value in positive.items():
            if value < 1:
                raise InputError(f"--{_flag(name)} must be at least 1 (got {value})")
        for name in ("dense_layers", "q_lora_rank"):
            if (value := getattr(self, name)) is not None and value < 0:
                raise InputError(f"--{_flag(name)} must be at least 0 (got {value})")
        if self.rotary_fraction is not None and not 0 < self.rotary_fraction <= 1:
            raise InputError(f"--rotary-fraction must be in (0, 1] (got {self.rotary_fraction})")

    def _check_heads(self, s: Shape) -> None:
        if self.family == "deepseek_v2" and self.hidden % self.heads:
            raise InputError(  # transformers' DeepseekV2Config refuses it (tokenizer loading)
                f"--heads {self.heads} must divide --hidden {self.hidden} for deepseek_v2"
            )
        if self.family in _MLA:  # its head sizes are its own options
            if s.qk_rope_dim % 2:
                raise InputError(
                    f"--qk-rope-dim {s.qk_rope_dim} must be even for rotary embeddings"
                )
            return
        if self.head_dim is None and self.hidden % self.heads:
            raise InputError(f"--heads {self.heads} must divide --hidden {self.hidden}")
        if s.head_dim % 2:
            what = "--head-dim" if self.head_dim else "hidden/heads (the head size)"
            raise InputError(f"{what} must be even for rotary embeddings")
        if self.heads % self.kv_heads:
            raise InputError(f"--kv-heads {self.kv_heads} must divide --heads {self.heads}")
        if self.family == "step3p5":
            self._check_step3p5(s)
        rotary = int(s.head_dim * s.rotary_fraction)
        if self.family in ("glm4_moe", "minimax") and (rotary < 2 or rotary % 2):
            raise InputError(
                f"--rotary-fraction {s.rotary_fraction} of head size {s.head_dim} gives "
                f"{rotary} rotary dimensions: it must give an even number, at least 2"
            )

    def _check_step3p5(self, s: Shape) -> None:
        if s.other_heads % s.other_kv_heads:
            raise InputError(
                f"--other-kv-heads {s.other_kv_heads} must divide --other-heads {s.other_heads}"
            )
        _check_rotary(s.head_dim, STEP3P5_ROTARY, "Step-3.5's", "on full layers: ", 4)

    def _check_linear(self, s: Shape) -> None:
        if s.linear_value_heads % s.linear_key_heads:
            raise InputError(
                f"--linear-value-heads {s.linear_value_heads} must be a multiple of "
                f"--linear-key-heads {s.linear_key_heads}"
            )
        if not 2 <= s.full_attention_interval <= self.layers:
            raise InputError(  # mlx-lm reads the first of each kind's cache: both must exist
                f"--full-attention-interval must be from 2 to --layers {self.layers} (got "
                f"{s.full_attention_interval}): a linear and a full-attention layer at least"
            )
        _check_rotary(s.head_dim, QWEN3_5_ROTARY, "Qwen3.5's", "", 8)

    def _check_experts(self, s: Shape) -> None:
        if s.experts_per_token > s.experts:
            raise InputError(
                f"--experts-per-token {s.experts_per_token} must be at most --experts {s.experts}"
            )
        if self.family == "qwen3_moe" and not self.moe_layers():
            raise InputError(
                f"--dense-layers {s.dense_layers} and --sparse-step {s.sparse_step} leave no "
                f"mixture-of-experts layer among {self.layers}: make them smaller"
            )
        if self.family in (*_ROUTED, "step3p5") and s.dense_layers >= self.layers:
            raise InputError(
                f"--dense-layers {s.dense_layers} must be less than --layers {self.layers} "
                "(one mixture-of-experts layer at least)"
            )
        if self.family not in _ROUTED:
            return
        groups = s.expert_groups
        if s.experts % groups:
            raise InputError(f"--expert-groups {groups} must divide --experts {s.experts}")
        if groups > 1 and s.experts // groups < 2:
            raise InputError(  # a group is scored by its two best experts
                f"--expert-groups {groups} leaves fewer than 2 of --experts {s.experts} per group"
            )
        if s.groups_per_token > groups:
            raise InputError(
                f"--groups-per-token {s.groups_per_token} must be at most --expert-groups {groups}"
            )
        if s.groups_per_token * (s.experts // groups) < s.experts_per_token:
            raise InputError(
                f"--groups-per-token {s.groups_per_token} of --expert-groups {groups} hold fewer "
                f"than --experts-per-token {s.experts_per_token} experts"
            )

    def _check_quantization(self) -> None:
        if self.quantize_bits not in QUANT_BITS:
            bits = ", ".join(map(str, QUANT_BITS))
            raise InputError(f"--quantize-bits must be one of {bits} (got {self.quantize_bits})")
        if self.group_size not in (32, 64, 128) or self.hidden % self.group_size:
            raise InputError(
                f"--group-size {self.group_size} must be 32, 64 or 128 and divide --hidden"
            )
        # mlx-lm's quant_predicate for these packs the router to 8 bits in groups of 64
        routers = ("qwen3_moe", "gpt_oss", "qwen3_5_moe", "minimax", "step3p5")
        if self.family in routers and self.hidden % ROUTER_GROUP:
            raise InputError(
                f"--hidden {self.hidden} must be a multiple of {ROUTER_GROUP} to quantize "
                f"{self.family}: mlx-lm quantizes its router in groups of {ROUTER_GROUP}"
            )

    def moe_layers(self) -> tuple[int, ...]:
        """The layers with experts (none for a dense family), as mlx-lm's model builds them."""
        s = self.shape()
        if self.family not in MOE_FAMILIES:
            return ()
        if self.family == "qwen3_moe":
            steps = range(s.sparse_step - 1, self.layers, s.sparse_step)
            return tuple(i for i in steps if i >= s.dense_layers)
        start = 0 if self.family in ("gpt_oss", "qwen3_5_moe", "minimax") else s.dense_layers
        return tuple(range(start, self.layers))

    def parameters(self) -> int:
        """How many weights the unquantized model has, the same count as mlx-lm's model."""
        s, h = self.shape(), self.hidden
        moe = len(self.moe_layers())
        tied = self.family in ("qwen2", "qwen3", "qwen3_5")
        per_layer = self._attention_parameters(s) + 2 * h  # + the two RMSNorms
        dense = 3 * h * s.intermediate
        total = self.layers * per_layer + moe * self._moe_parameters(s)
        if self.family in _HYBRID:  # the linear layers hold a gated delta net instead
            linear = sum((i + 1) % s.full_attention_interval != 0 for i in range(self.layers))
            total += linear * (self._linear_parameters(s) - self._attention_parameters(s))
        if self.family == "step3p5":  # the sliding layers have heads of their own
            other = self._attention_parameters(s, s.other_heads, s.other_kv_heads)
            total += len(self.sliding_layers()) * (other - self._attention_parameters(s))
        total += (self.layers - moe) * dense
        return total + (1 if tied else 2) * self.vocab * h + h  # + the final norm

    def sliding_layers(self) -> tuple[int, ...]:
        """Step-3.5's sliding-window layers (none for another family)."""
        if self.family != "step3p5":
            return ()
        return tuple(i for i in range(self.layers) if i % STEP3P5_FULL_EVERY)

    def _attention_parameters(
        self, s: Shape, heads: int | None = None, kv_heads: int | None = None
    ) -> int:
        h, heads = self.hidden, _given(heads, self.heads)
        kv_heads = _given(kv_heads, self.kv_heads)
        if self.family in _MLA:  # DeepSeek V2's kv_b_proj holds as many as the latent maps
            q_head = s.qk_nope_dim + s.qk_rope_dim
            if s.q_lora_rank:
                q = h * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * heads * q_head
            else:
                q = h * heads * q_head
            kv = h * (s.kv_lora_rank + s.qk_rope_dim) + s.kv_lora_rank
            latent = heads * s.kv_lora_rank * (s.qk_nope_dim + s.v_head_dim)
            if self.family == "deepseek_v32":  # the indexer: queries, key (+ LayerNorm), weights
                d = 2 * s.qk_rope_dim
                q += s.q_lora_rank * INDEX_HEADS * d + h * d + 2 * d + h * INDEX_HEADS
            return q + kv + latent + heads * s.v_head_dim * h
        q, kv = heads * s.head_dim, kv_heads * s.head_dim
        weights = 2 * h * q + 2 * h * kv
        if self.family == "step3p5":  # g_proj: a gate logit per head; per-head q and k norms
            return weights + h * heads + 2 * s.head_dim
        if self.family in _HYBRID:  # q_proj writes a gate per query; q and k norms
            return weights + h * q + 2 * s.head_dim
        if self.family == "minimax":  # its q and k norms span the whole projections
            return weights + (q + kv) * s.qk_norm
        biases = {"qwen2": q + 2 * kv, "glm4_moe": q + 2 * kv, "gpt_oss": q + 2 * kv + h}
        qk_norm = self.family in ("qwen3", "qwen3_moe", "exaone_moe")
        qk_norm = qk_norm or (self.family == "glm4_moe" and s.qk_norm)
        sinks = heads if self.family == "gpt_oss" else 0
        return weights + biases.get(self.family, 0) + 2 * s.head_dim * qk_norm + sinks

    def _linear_parameters(self, s: Shape) -> int:
        """A gated delta net: in_proj_qkv (and its depthwise conv, 4 taps), in_proj_z,
        in_proj_b/a, dt_bias and A_log per value head, the output norm and out_proj."""
        h, nv = self.hidden, s.linear_value_heads
        values = nv * s.linear_value_head_dim
        conv = 2 * s.linear_key_heads * s.linear_key_head_dim + values
        norm = s.linear_value_head_dim
        return conv * (h + LINEAR_CONV) + 2 * h * values + 2 * h * nv + 2 * nv + norm

    def _moe_parameters(self, s: Shape) -> int:
        h, e, w = self.hidden, s.experts, s.moe_intermediate
        experts = 3 * e * h * w
        if self.family == "qwen3_moe":
            return h * e + experts
        if self.family == "minimax":  # a router and its score correction bias
            return h * e + e + experts
        if self.family == "step3p5":  # a router, its bias, one shared expert
            return h * e + e + experts + 3 * h * w * s.shared_experts
        if self.family == "qwen3_5_moe":  # + the shared expert and its one-logit gate
            return h * e + experts + 3 * h * w * s.shared_experts + h
        if self.family == "gpt_oss":  # router and every expert projection have biases
            return h * e + e + experts + 2 * e * w + e * h
        shared = 3 * h * w * s.shared_experts
        if self.family == "deepseek_v2":  # a softmax gate: no score correction bias
            return e * h + experts + shared
        return e * h + e + experts + shared  # gate weight, its score correction bias


def _given(value: T | None, default: T) -> T:
    return default if value is None else value


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _check_rotary(head_dim: int, fraction: float, family: str, where: str, multiple: int) -> None:
    """A partial rotary fraction must give an even number of rotary dimensions, at least 2."""
    rotary = int(head_dim * fraction)
    if rotary < 2 or rotary % 2:
        raise InputError(
            f"the head size {head_dim} gives {rotary} rotary dimensions at {family} "
            f"{fraction} {where}make it a multiple of {multiple}"
        )


def write_tiny_model(
    directory: str | Path,
    family: str = "llama",
    layers: int = 4,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vocab: int = 384,
    quantize_bits: int | None = None,
    group_size: int = 32,
    seed: int = 0,
    *,
    head_dim: int | None = None,
    experts: int | None = None,
    experts_per_token: int | None = None,
    moe_intermediate: int | None = None,
    shared_experts: int | None = None,
    dense_layers: int | None = None,
    sparse_step: int | None = None,
    expert_groups: int | None = None,
    groups_per_token: int | None = None,
    q_lora_rank: int | None = None,
    kv_lora_rank: int | None = None,
    qk_rope_dim: int | None = None,
    qk_nope_dim: int | None = None,
    v_head_dim: int | None = None,
    rotary_fraction: float | None = None,
    qk_norm: bool | None = None,
    sliding_window: int | None = None,
    linear_key_heads: int | None = None,
    linear_value_heads: int | None = None,
    linear_key_head_dim: int | None = None,
    linear_value_head_dim: int | None = None,
    full_attention_interval: int | None = None,
    other_heads: int | None = None,
    other_kv_heads: int | None = None,
) -> Path:
    """Write config, per-layer safetensors + index and tokenizer files into `directory`.

    The options after `seed` apply to some families only (TinySpec); None: the default."""
    spec = TinySpec(
        family,
        layers,
        hidden,
        heads,
        kv_heads,
        intermediate,
        vocab,
        quantize_bits,
        group_size,
        seed,
        head_dim=head_dim,
        experts=experts,
        experts_per_token=experts_per_token,
        moe_intermediate=moe_intermediate,
        shared_experts=shared_experts,
        dense_layers=dense_layers,
        sparse_step=sparse_step,
        expert_groups=expert_groups,
        groups_per_token=groups_per_token,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=kv_lora_rank,
        qk_rope_dim=qk_rope_dim,
        qk_nope_dim=qk_nope_dim,
        v_head_dim=v_head_dim,
        rotary_fraction=rotary_fraction,
        qk_norm=qk_norm,
        sliding_window=sliding_window,
        linear_key_heads=linear_key_heads,
        linear_value_heads=linear_value_heads,
        linear_key_head_dim=linear_key_head_dim,
        linear_value_head_dim=linear_value_head_dim,
        full_attention_interval=full_attention_interval,
        other_heads=other_heads,
        other_kv_heads=other_kv_heads,
    )
    spec.check()
    out = Path(directory)
    if out.is_symlink():  # replace what the link points at, never the link itself
        out = out.resolve()
    _check_target(out)
    write_folder(out, partial(_write_model, spec=spec))
    return out


def _check_target(out: Path) -> None:
    """Refuse a path that is not ours: a file, or a non-empty directory without our marker."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory: choose another path")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise InputError(f"{out} is not empty and holds no tiny model: choose an empty path")


def _write_model(out: Path, spec: TinySpec) -> None:
    """Every file of the model into `out` (an empty directory)."""
    (out / MARKER).write_text(json.dumps(asdict(spec), indent=2))
    tokenizer_json, eos_id, vocab_size = _train_tokenizer(spec.vocab)
    (out / "tokenizer.json").write_text(tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=2))
    config = _model_config(spec, vocab_size=vocab_size, eos=eos_id)
    model = _random_model(spec, config)
    if spec.quantize_bits is not None:
        from mlx_lm.utils import quantize_model

        with contextlib.redirect_stdout(io.StringIO()):  # it prints a bits-per-weight line
            model, config = quantize_model(model, config, spec.group_size, spec.quantize_bits)
    save_weights_by_layer(out, dict(_flat(model.parameters())), spec.layers)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def _train_tokenizer(vocab: int) -> tuple[str, int, int]:
    """A byte-level BPE trained on CORPUS; returns JSON, end-of-turn id, size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[PAD, TURN, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    eos = tok.token_to_id(EOS)
    assert eos is not None
    return tok.to_str(), eos, tok.get_vocab_size()


def _tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONTEXT,
    }


def _model_config(spec: TinySpec, vocab_size: int, eos: int) -> dict[str, object]:
    """config.json as the family's Hugging Face checkpoints write it (the keys mlx-lm reads,
    and a few it does not that tell the family apart), at the spec's sizes."""
    s = spec.shape()
    config: dict[str, object] = {
        "model_type": spec.family,
        "architectures": [ARCHITECTURES[spec.family]],
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "intermediate_size": s.intermediate,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": s.head_dim,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": CONTEXT,
        # llama keeps a separate lm_head; qwen ties it to the embeddings: both paths get tested
        "tie_word_embeddings": spec.family in ("qwen2", "qwen3", "qwen3_5"),
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }
    family_keys = {
        "qwen3_moe": _qwen3_moe,
        "deepseek_v3": _deepseek_v3,
        "glm4_moe": _glm4_moe,
        "gpt_oss": _gpt_oss,
        "ministral3": _ministral3,
        "deepseek_v2": _deepseek_v2,
        "glm4_moe_lite": _glm4_moe_lite,
        "exaone_moe": _exaone_moe,
        "deepseek_v32": _deepseek_v32,
        "qwen3_5": _qwen3_5,
        "qwen3_5_moe": _qwen3_5,
        "minimax": _minimax,
        "step3p5": _step3p5,
    }.get(spec.family)
    if family_keys is not None:  # the older dense families' files stay as they were
        config |= {"hidden_act": "silu"} | family_keys(spec, s)
    if spec.family in _MLA:  # MLA's head sizes are its own keys, as in DeepSeek's file
        del config["head_dim"]
    if spec.family == "step3p5":  # its KV heads are num_attention_groups
        del config["num_key_value_heads"]
    if spec.family in _HYBRID:  # a multimodal checkpoint: the decoder's keys in text_config
        top = ("model_type", "architectures", "tie_word_embeddings", "eos_token_id")
        text = {k: v for k, v in config.items() if k not in top[:2]}
        text["model_type"] = f"{spec.family}_text"
        config = {k: config[k] for k in top} | {"text_config": text}
    return config


def _qwen3_moe(spec: TinySpec, s: Shape) -> dict[str, object]:
    return {
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "num_experts": s.experts,
        "num_experts_per_tok": s.experts_per_token,
        "moe_intermediate_size": s.moe_intermediate,
        "norm_topk_prob": True,
        "decoder_sparse_step": s.sparse_step,
        "mlp_only_layers": list(range(s.dense_layers)),
    }


def _qwen3_5(spec: TinySpec, s: Shape) -> dict[str, object]:
    """Qwen3.5: gated delta net layers with every full_attention_interval-th one gated full
    attention (rotary on a quarter of the head, in rope_parameters); its MoE variant routes
    every layer's experts, a gated shared expert beside them."""
    config: dict[str, object] = {
        "rms_norm_eps": 1e-6,
        "linear_num_key_heads": s.linear_key_heads,
        "linear_num_value_heads": s.linear_value_heads,
        "linear_key_head_dim": s.linear_key_head_dim,
        "linear_value_head_dim": s.linear_value_head_dim,
        "linear_conv_kernel_dim": LINEAR_CONV,
        "full_attention_interval": s.full_attention_interval,
        "attn_output_gate": True,
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": QWEN3_5_ROTARY,
            "mrope_section": [2, 1, 1],
        },
    }
    if spec.family == "qwen3_5_moe":
        config |= {
            "num_experts": s.experts,
            "num_experts_per_tok": s.experts_per_token,
            "moe_intermediate_size": s.moe_intermediate,
            "shared_expert_intermediate_size": s.moe_intermediate * s.shared_experts,
            "norm_topk_prob": True,
        }
    return config


def _routed_experts(s: Shape) -> dict[str, object]:
    """DeepSeek-style routing, shared by deepseek_v3 and glm4_moe: sigmoid scores, a per-expert
    correction bias, best groups first, shared experts beside, the first layers dense."""
    return {
        "n_routed_experts": s.experts,
        "n_shared_experts": s.shared_experts,
        "num_experts_per_tok": s.experts_per_token,
        "moe_intermediate_size": s.moe_intermediate,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "n_group": s.expert_groups,
        "topk_group": s.groups_per_token,
        "first_k_dense_replace": s.dense_layers,
        "num_nextn_predict_layers": 0,  # no multi-token-prediction layer is written
    }


def _mla(spec: TinySpec, s: Shape) -> dict[str, object]:
    """Latent attention's sizes, as DeepSeek's and GLM's files key them."""
    return {
        "num_key_value_heads": spec.heads,  # MLA: every head reads the shared latent
        "q_lora_rank": s.q_lora_rank or None,
        "kv_lora_rank": s.kv_lora_rank,
        "qk_rope_head_dim": s.qk_rope_dim,
        "qk_nope_head_dim": s.qk_nope_dim,
        "v_head_dim": s.v_head_dim,
    }


def _deepseek_v3(spec: TinySpec, s: Shape) -> dict[str, object]:
    return (
        _routed_experts(s)
        | _mla(spec, s)
        | {
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "moe_layer_freq": 1,
            "attention_bias": False,
            "rms_norm_eps": 1e-6,
            "rope_scaling": YARN | {"mscale": 1.0, "mscale_all_dim": 1.0, "type": "yarn"},
        }
    )


def _deepseek_v32(spec: TinySpec, s: Shape) -> dict[str, object]:
    """DeepSeek-V3.2: V3 with an indexer choosing INDEX_TOPK tokens of the context."""
    return _deepseek_v3(spec, s) | {
        "index_n_heads": INDEX_HEADS,
        "index_head_dim": 2 * s.qk_rope_dim,
        "index_topk": INDEX_TOPK,
    }


def _deepseek_v2(spec: TinySpec, s: Shape) -> dict[str, object]:
    """DeepSeek-V2: softmax scores, the best groups' experts (its files say "greedy" when
    there is one group)."""
    grouped = s.expert_groups > 1
    return (
        _routed_experts(s)
        | _mla(spec, s)
        | {
            "scoring_func": "softmax",
            "topk_method": "group_limited_greedy" if grouped else "greedy",
            "moe_layer_freq": 1,
            "attention_bias": False,
            "rms_norm_eps": 1e-6,
            "rope_scaling": YARN | {"mscale": 0.707, "mscale_all_dim": 0.707, "type": "yarn"},
        }
    )


def _glm4_moe_lite(spec: TinySpec, s: Shape) -> dict[str, object]:
    """GLM-4.7-Flash: DeepSeek-V3's attention and routing, its rotary on the whole rope part."""
    return (
        _routed_experts(s)
        | _mla(spec, s)
        | {
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "moe_layer_freq": 1,
            "attention_bias": False,
            "partial_rotary_factor": 1.0,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
        }
    )


def _exaone_moe(spec: TinySpec, s: Shape) -> dict[str, object]:
    """K-EXAONE: three sliding-window layers to a global one (rotary on the sliding ones
    only), a flag per layer for experts, DeepSeek-V3's routing."""
    kinds = ("sliding_attention",) * 3 + ("full_attention",)
    routed = _routed_experts(s)
    del routed["first_k_dense_replace"], routed["num_nextn_predict_layers"]  # is_moe_layer, mtp.*
    return {
        "num_experts": routed.pop("n_routed_experts"),
        "num_shared_experts": routed.pop("n_shared_experts"),
        **routed,
        "is_moe_layer": [i >= s.dense_layers for i in range(spec.layers)],
        "sliding_window": s.sliding_window,
        "layer_types": [kinds[i % 4] for i in range(spec.layers)],
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "rope_theta": 1000000.0,
        "rope_scaling": None,
    }


def _ministral3(spec: TinySpec, s: Shape) -> dict[str, object]:
    """Ministral 3: YaRN with Llama 4's position-dependent query scale, in rope_parameters."""
    # its YaRN factor of 16, over a short original context so that tests pass beyond it
    rope: dict[str, object] = {**YARN, "factor": 16.0}
    rope |= {"original_max_position_embeddings": CONTEXT // 16, "rope_type": "yarn"}
    rope |= {"mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 1000000.0}
    return {
        "rope_parameters": rope | {"llama_4_scaling_beta": 0.1},
        "sliding_window": None,
    }


def _glm4_moe(spec: TinySpec, s: Shape) -> dict[str, object]:
    return _routed_experts(s) | {
        "partial_rotary_factor": s.rotary_fraction,
        "use_qk_norm": s.qk_norm,
        "attention_bias": True,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
    }


def _minimax(spec: TinySpec, s: Shape) -> dict[str, object]:
    """MiniMax-M2: experts only (sigmoid scores, a correction bias), RMSNorms over the whole
    query and key projections, rotary on part of each head."""
    return {
        "num_local_experts": s.experts,
        "num_experts_per_tok": s.experts_per_token,
        "intermediate_size": s.moe_intermediate,  # MiniMax's is the experts' width
        "shared_intermediate_size": 0,
        "rotary_dim": int(s.head_dim * s.rotary_fraction),
        "use_qk_norm": s.qk_norm,
        "scoring_func": "sigmoid",
        "rms_norm_eps": 1e-6,
        "rope_theta": 5000000.0,
    }


def _step3p5(spec: TinySpec, s: Shape) -> dict[str, object]:
    """Step-3.5-Flash: a full-attention layer then three sliding-window ones, the sliding ones
    with head counts of their own (attention_other_setting) and rotary on the whole head (the
    full ones on half, another base); a gate logit per head; the first layers dense, then
    experts beside one shared expert, the last layer's SwiGLUs clamped."""
    sliding = spec.sliding_layers()
    kinds = ["sliding_attention" if i in sliding else "full_attention" for i in range(spec.layers)]
    moe = spec.moe_layers()
    last = [7.0 if i == spec.layers - 1 and i in moe else 0.0 for i in range(spec.layers)]
    return {
        "num_attention_groups": spec.kv_heads,
        "attention_other_setting": {
            "attention_type": "sliding_attention",
            "num_attention_heads": s.other_heads,
            "num_attention_groups": s.other_kv_heads,
            "head_dim": s.head_dim,
        },
        "layer_types": kinds,
        "sliding_window": s.sliding_window,
        "rope_theta": [10000.0 if i in sliding else 5000000.0 for i in range(spec.layers)],
        "partial_rotary_factors": [
            1.0 if i in sliding else STEP3P5_ROTARY for i in range(spec.layers)
        ],
        "yarn_only_types": ["full_attention"],
        "rope_scaling": None,
        "use_head_wise_attn_gate": True,
        "use_qk_norm": True,
        "moe_num_experts": s.experts,
        "moe_top_k": s.experts_per_token,
        "moe_intermediate_size": s.moe_intermediate,
        "share_expert_dim": s.moe_intermediate * s.shared_experts,
        "moe_layers_enum": ",".join(map(str, moe)),
        "moe_router_activation": "sigmoid",
        "moe_router_scaling_factor": 3.0,
        "norm_expert_weight": True,
        "swiglu_limits": last,
        "swiglu_limits_shared": [2 * x for x in last],
    }


def _gpt_oss(spec: TinySpec, s: Shape) -> dict[str, object]:
    kinds = ("sliding_attention", "full_attention")
    return {
        "num_local_experts": s.experts,
        "num_experts_per_tok": s.experts_per_token,
        "experts_per_token": s.experts_per_token,
        "intermediate_size": s.moe_intermediate,  # gpt-oss's is the experts' width
        "sliding_window": s.sliding_window,
        "layer_types": [kinds[i % 2] for i in range(spec.layers)],
        "attention_bias": True,
        "swiglu_limit": 7.0,
        "rope_theta": 150000.0,
        "rope_scaling": YARN | {"rope_type": "yarn", "truncate": False},
        "initial_context_length": YARN["original_max_position_embeddings"],
    }


def _random_model(spec: TinySpec, config: dict[str, object]) -> nn.Module:
    """mlx-lm's own model class with seeded weights scaled so each layer changes the state."""
    arch = importlib.import_module(f"mlx_lm.models.{spec.family}")
    model: nn.Module = arch.Model(arch.ModelArgs.from_dict(config))
    rng = np.random.default_rng(spec.seed)
    params = []
    for name, value in _flat(model.parameters()):
        new: np.ndarray
        if name.endswith("norm.weight"):
            new = np.ones(value.shape)
        elif name.endswith((".bias", "_bias")):  # _bias: DeepSeek's router score correction
            new = rng.normal(0.0, 0.1, value.shape)
        elif name.endswith(".sinks"):  # gpt-oss: one attention logit per head, no value
            new = rng.normal(0.0, 1.0, value.shape)
        elif name.endswith("conv1d.weight"):  # Qwen3.5's depthwise conv: fan-in is its taps
            new = rng.normal(0.0, 1.5 / np.sqrt(value.shape[1]), value.shape)
        elif "embed_tokens" in name:  # small: with tied heads a large one makes each token
            new = rng.normal(0.0, 0.3, value.shape)  # predict itself forever
        elif "lm_head" in name:
            new = rng.normal(0.0, 1.0, value.shape)
        else:  # 1/sqrt(fan_in) keeps activations O(1); 1.5x makes attention sharp enough to vary
            new = rng.normal(0.0, 1.5 / np.sqrt(value.shape[-1]), value.shape)
        params.append((name, mx.array(new.astype(np.float32))))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def _flat(tree: Any) -> list[tuple[str, mx.array]]:
    return cast(list[tuple[str, mx.array]], tree_flatten(tree))
