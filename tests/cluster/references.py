"""The tiny models the rank tests use and the single-process mlx-lm reference every
multi-rank run is compared with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT = "Tell me about the sea and the mountains"
MODELS: dict[str, dict[str, Any]] = {
    # 8 heads / 4 KV heads: splits over 2 and 4 ranks
    "llama": {"family": "llama", "layers": 6, "hidden": 128, "heads": 8, "kv_heads": 4},
    "qwen2": {"family": "qwen2", "layers": 6, "hidden": 128, "heads": 8, "kv_heads": 4},
    "qwen3_q4": {
        "family": "qwen3",
        "layers": 4,
        "hidden": 128,
        "heads": 4,
        "kv_heads": 2,
        "quantize_bits": 4,
        "group_size": 32,
    },
    # 3 KV heads: mlx-lm's shard() would accept 2 ranks and fail at the first token
    "kv3": {"family": "llama", "layers": 2, "hidden": 96, "heads": 6, "kv_heads": 3},
}


@dataclass(frozen=True)
class Reference:
    tokens: list[int]
    text: str
    logits: list[list[float]]


def reference(model_dir: Path, prompt: str, max_tokens: int, steps: int) -> Reference:
    """Plain mlx-lm in this process: load, chat template, greedy stream_generate."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = load(str(model_dir))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    kept: list[mx.array] = []

    def keep(tokens: mx.array, logits: mx.array) -> mx.array:
        if len(kept) < steps:
            kept.append(logits[0])
        return logits

    tokens, text = [], ""
    for r in stream_generate(
        model,
        tokenizer,
        mx.array(ids),
        max_tokens=max_tokens,
        sampler=make_sampler(0.0),
        logits_processors=[keep],
    ):
        text += r.text
        if r.finish_reason != "stop":
            tokens.append(r.token)
    return Reference(tokens, text, [row.tolist() for row in kept])
