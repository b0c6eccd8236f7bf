"""A tiny random-weight model that mlx-lm loads like a real checkpoint, built offline.

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
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from cluster.model_folder import save_weights_by_layer, write_folder
from topology.errors import InputError

FAMILIES = ("llama", "qwen2", "qwen3")
QUANT_BITS = (2, 3, 4, 6, 8)
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
class TinySpec:
    family: str = "llama"
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 384
    quantize_bits: int | None = None
    group_size: int = 32
    seed: int = 0

    def check(self) -> None:
        """Raise InputError naming the first bad value and what would work."""
        positive = {"layers": self.layers, "hidden": self.hidden, "heads": self.heads}
        positive |= {"kv-heads": self.kv_heads, "intermediate": self.intermediate}
        for name, value in positive.items():
            if value < 1:
                raise InputError(f"--{name} must be at least 1 (got {value})")
        if self.family not in FAMILIES:
            raise InputError(f"unknown family {self.family!r}: use one of {', '.join(FAMILIES)}")
        if self.hidden % self.heads:
            raise InputError(f"--heads {self.heads} must divide --hidden {self.hidden}")
        if (self.hidden // self.heads) % 2:
            raise InputError("hidden/heads (the head size) must be even for rotary embeddings")
        if self.heads % self.kv_heads:
            raise InputError(f"--kv-heads {self.kv_heads} must divide --heads {self.heads}")
        if not 300 <= self.vocab <= 4096:
            raise InputError(f"--vocab must be between 300 and 4096 (got {self.vocab})")
        if (n := self.parameters()) > MAX_PARAMETERS:
            raise InputError(
                f"--layers/--hidden/--intermediate give {n:,} parameters; a tiny model has at "
                f"most {MAX_PARAMETERS:,}: make them smaller"
            )
        if self.quantize_bits is not None:
            if self.quantize_bits not in QUANT_BITS:
                bits = ", ".join(map(str, QUANT_BITS))
                raise InputError(
                    f"--quantize-bits must be one of {bits} (got {self.quantize_bits})"
                )
            if self.group_size not in (32, 64, 128) or self.hidden % self.group_size:
                raise InputError(
                    f"--group-size {self.group_size} must be 32, 64 or 128 and divide --hidden"
                )

    def parameters(self) -> int:
        """About how many weights the model has (embeddings twice when untied)."""
        head = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head
        per_layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden


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
) -> Path:
    """Write config, per-layer safetensors + index and tokenizer files into `directory`."""
    spec = TinySpec(
        family,
        layers,
        hidden,
        heads,
        kv_heads,
        intermediate or 2 * hidden,
        vocab,
        quantize_bits,
        group_size,
        seed,
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
        "model_max_length": 4096,
    }


def _model_config(spec: TinySpec, vocab_size: int, eos: int) -> dict[str, object]:
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    return {
        "model_type": spec.family,
        "architectures": [arch[spec.family]],
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "intermediate_size": spec.intermediate,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hidden // spec.heads,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        # llama keeps a separate lm_head; qwen ties it to the embeddings: both paths get tested
        "tie_word_embeddings": spec.family != "llama",
        "eos_token_id": eos,
        "torch_dtype": "float32",
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
        elif name.endswith(".bias"):
            new = rng.normal(0.0, 0.1, value.shape)
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
