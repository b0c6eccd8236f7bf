"""A pipeline stage for dense mlx-lm models that have no pipeline support of their own.

mlx-lm pipelines qwen2, qwen3_moe, deepseek... through PipelineMixin; llama, mistral and
qwen3 have none. `PipelineStage` wraps such a model and runs only layers [start, end):
the last rank embeds, each rank receives the hidden state from rank+1, runs its layers and
sends to rank-1, and rank 0 (which holds the LAST layers, as in mlx-lm) ends the chain. The
final hidden state is then all-gathered so every rank computes the same logits and samples
the same token, which keeps all ranks in lockstep inside mlx-lm's generate_step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

# mlx-lm model modules whose decoder layers are plain (x, mask, cache) blocks over one
# full-attention KV cache each (mistral maps to llama).
GENERIC_FAMILIES = ("llama", "qwen3")


def layer_range(num_layers: int, rank: int, size: int, split: Sequence[int] | None) -> range:
    """Layers of `rank`: the split counts layers per rank, rank 0 holding the last ones."""
    if split is None:  # even, low ranks take the extra layers (mlx-lm's rule)
        base, extra = divmod(num_layers, size)
        split = [base + (1 if r < extra else 0) for r in range(size)]
    start = sum(split[rank + 1 :])
    return range(start, start + split[rank])


class PipelineStage(nn.Module):
    """Wraps an mlx-lm `Model` (attributes `model.{embed_tokens,layers,norm}`, maybe
    `lm_head`), keeping parameter names so weights still load by name."""

    def __init__(self, model: nn.Module, group: Any, split: Sequence[int] | None = None):
        super().__init__()
        self.args = model.args
        self.model_type = model.model_type
        self.model = model.model
        self.tied = "lm_head" not in model
        if not self.tied:
            self.lm_head = model.lm_head
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        local = layer_range(len(self.model.layers), self.rank, self.size, split)
        self.start, self.end = local.start, local.stop
        # Drop the other ranks' layers but keep the numbering (None placeholders).
        kept = self.model.layers[: self.end]
        kept[: self.start] = [None] * self.start
        self.model.layers = kept

    @property
    def layers(self) -> list[nn.Module]:
        """The local layers: mlx-lm's make_prompt_cache makes one KV cache per entry."""
        return list(self.model.layers[self.start : self.end])

    def __call__(
        self, inputs: mx.array, cache: list[Any] | None = None, input_embeddings: Any = None
    ) -> mx.array:
        inner, layers = self.model, self.layers
        if cache is None:
            cache = [None] * len(layers)
        first, last = self.rank == self.size - 1, self.rank == 0
        if first:
            h = inner.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        else:  # only the shape and dtype matter: recv_like replaces it
            h = mx.zeros((*inputs.shape, self.args.hidden_size), dtype=inner.norm.weight.dtype)
        mask = create_attention_mask(h, cache[0])
        if not first:
            h = mx.distributed.recv_like(h, self.rank + 1, group=self.group)
        for layer, c in zip(layers, cache, strict=True):
            h = layer(h, mask, c)
        if not last:
            h = mx.distributed.send(h, self.rank - 1, group=self.group)
            # Prefill evaluates only the caches: tie the send to them so it is not skipped.
            if cache[-1] is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, h)
        # Rank 0's hidden state comes first in the gather: every rank gets the same logits.
        h = mx.distributed.all_gather(h, group=self.group)[: h.shape[0]]
        h = inner.norm(h)
        return inner.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)


def check_generic(model: nn.Module) -> str | None:
    """Why `model` cannot run as a generic stage, or None if it can."""
    family = type(model).__module__.rsplit(".", 1)[-1]
    if family not in GENERIC_FAMILIES:
        return f"model family {family!r} has no pipeline support in mlx-lm or mlx-cluster"
    if any(getattr(layer, "use_sliding", False) for layer in model.model.layers):
        return "sliding-window attention layers are not supported by the generic pipeline"
    return None
