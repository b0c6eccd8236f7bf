"""What a decode step costs beyond its compute, per strategy, timed as a step pays it.

A llama too small to compute anything (MINI_LAYERS layers of a few heads, random weights, made
in memory) decodes three ways on the calibration's ranks: whole on rank 0 while the others
wait, split in tensor shares (mlx-lm's `shard()`: two all-reduces a layer), and as pipeline
stages (cluster/pipeline_stage.py: a hand-off a stage and the final all_gather). What tensor
and pipeline take beyond the whole model is what the strategy costs a step on this backend:
collectives that wait on peers between a layer's small ops, sleeping sockets waking, the
step's synchronisation. All-sums timed back to back miss it (here: 0.35 ms each in a tensor
step over 2 local ranks against 0.1 ms back to back).
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import mlx.nn as nn

MINI_LAYERS = 8
MINI_HEAD_DIM = 8
MINI_VOCAB = 256
PROMPT_TOKENS = 8
DECODE_TOKENS = 48  # after the first: a few ms each, so a run takes well under a second
RUNS = 3  # the fastest counts: a process's first run pays for warming up (6 ms a token, not 3)


def mini_model(ranks: int, dtype: mx.Dtype) -> nn.Module:
    """A llama in `dtype` whose widths split evenly over `ranks` (mlx-lm's `shard()` needs
    that)."""
    from mlx_lm.models import llama

    heads = 2 * ranks
    hidden = heads * MINI_HEAD_DIM
    args = llama.ModelArgs(
        model_type="llama", hidden_size=hidden, num_hidden_layers=MINI_LAYERS,
        intermediate_size=2 * hidden, num_attention_heads=heads, num_key_value_heads=heads,
        rms_norm_eps=1e-5, vocab_size=MINI_VOCAB, head_dim=MINI_HEAD_DIM,
        tie_word_embeddings=False,
    )  # fmt: skip
    mx.random.seed(0)  # every rank the same weights: the same tokens, in lockstep
    model = llama.Model(args)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def per_token_s(model: Any) -> float:
    """Seconds a decoded token after the first (greedy, mlx-lm's generate_step), the fastest
    of RUNS runs."""
    from mlx_lm.generate import generate_step

    prompt = mx.arange(PROMPT_TOKENS, dtype=mx.int32) % MINI_VOCAB
    best = float("inf")
    for _ in range(RUNS):
        times = [
            time.perf_counter() for _ in generate_step(prompt, model, max_tokens=DECODE_TOKENS + 1)
        ]
        best = min(best, (times[-1] - times[0]) / max(1, len(times) - 1))
    return best


def step_costs(group: Any, dtype: mx.Dtype) -> dict[str, float]:
    """Seconds a token of the mini model (in the activations' `dtype`, `step_layers` layers)
    takes whole (rank 0 alone), in tensor shares and in pipeline stages over `group`; every
    rank must call it."""
    from cluster.generate import barrier
    from cluster.pipeline_stage import PipelineStage

    n = group.size()
    whole = mini_model(n, dtype)

    def alone() -> float:
        """Rank 0 decodes the whole model while the others wait (0 on them)."""
        seconds = per_token_s(whole) if group.rank() == 0 else 0.0
        barrier(group)
        return seconds

    first = alone()
    tensor = mini_model(n, dtype)
    tensor.shard(group)
    mx.eval(tensor.parameters())
    tensor_s = per_token_s(tensor)
    barrier(group)
    pipeline_s = per_token_s(PipelineStage(mini_model(n, dtype), group))
    barrier(group)
    # before and after the others: a burst of other work on the machine spoils one, not both
    # (rank 0 alone came out at 2.3 ms a token in some runs here, 4.5-6.9 in others)
    return {
        "step_layers": MINI_LAYERS, "alone_s": min(first, alone()), "tensor_s": tensor_s,
        "pipeline_s": pipeline_s,
    }  # fmt: skip
