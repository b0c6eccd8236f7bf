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
    """Plain mlx-lm in this process: load, chat template, greedy stream_generate (its tokens
    and text are also what decoding with drafts gives in this process)."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    from cluster.speculative.stream import DraftedStream

    model, tokenizer = load(str(model_dir))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )

    def keeper(kept: list[mx.array]) -> Any:
        def keep(tokens: mx.array, logits: mx.array) -> mx.array:
            if len(kept) < steps:
                kept.append(logits[0])
            return logits

        return keep

    plain_kept: list[mx.array] = []
    plain = stream_generate(
        model,
        tokenizer,
        mx.array(ids),
        max_tokens=max_tokens,
        sampler=make_sampler(0.0),
        logits_processors=[keeper(plain_kept)],
    )
    tokens, text = _collect(plain)
    drafted = DraftedStream(
        model,
        tokenizer,
        list(ids),
        max_tokens=max_tokens,
        sampler=None,
        logits_processors=[keeper([])],
        prefill_step_size=2048,
        prompt_progress_callback=lambda done, total: None,
    )
    assert _collect(drafted) == (tokens, text), "drafts changed one process's tokens"
    return Reference(tokens, text, [row.tolist() for row in plain_kept])


def _collect(responses: Any) -> tuple[list[int], str]:
    tokens, text = [], ""
    for r in responses:
        text += r.text
        if r.finish_reason != "stop":
            tokens.append(r.token)
    return tokens, text
