"""Time to first token: a prompt run through the chosen plan in chunks of PREFILL_CHUNK rows,
then the one-row step that feeds its last token and gives the first token, as mlx-lm runs it.

Each chunk is one step of the step-time model (predict.py) at that many rows: weights read once
a chunk, the KV cache as far as the chunk reaches, FLOPs × rows over each rank's measured
throughput at that row count — on a Mac, prefill is compute-bound, so only a measured host gives
a figure: a rates.json, or for a Mac never measured the chip table's assumed rate
(topology/chips.py; the plan says which). Pipeline stages run a chunk one after the other
(mlx-lm does not overlap them).
"""

from __future__ import annotations

from collections.abc import Sequence

from topology.chips import BackendCost
from topology.model.spec import ModelSpec
from topology.planning.options import Option, rank_rates
from topology.planning.placement import Slot
from topology.planning.predict import PREFILL_CHUNK, pipeline_seconds, tensor_seconds
from topology.planning.tensor_costs import rank_costs

DEFAULT_PROMPT_TOKENS = 1024


def compute_source(slots: Sequence[Slot]) -> str | None:
    """Where the ranks' compute figures come from: "measured" (every host's rates.json),
    "assumed" (every host's chip table figure), "mixed"; None when a rank has neither."""
    sources = {s.rates.source if s.rates else None for s in slots}
    if None in sources or not sources:
        return None
    return sources.pop() if len(sources) == 1 else "mixed"


def ttft_seconds(
    spec: ModelSpec, option: Option, slots: Sequence[Slot], cost: BackendCost, prompt_tokens: int
) -> float | None:
    """Seconds from a prompt of `prompt_tokens` to its first token; None when a rank's compute
    is neither measured nor in the chip table (memory alone would call a 512-row chunk as cheap
    as one token)."""
    if prompt_tokens < 1 or any(s.rates is None for s in slots):
        return None
    bandwidths = [s.bandwidth_gbs for s in slots]

    def step(rows: int, reach: int) -> float:
        rates = rank_rates(spec, slots, rows)
        if option.strategy == "tensor" and option.layout is not None:
            costs = rank_costs(spec, option.layout, reach)
            return tensor_seconds(spec, costs, bandwidths, cost, rates, rows)[0]
        stages = [load.layers for load in option.loads]
        return pipeline_seconds(spec, stages, bandwidths, cost, reach, rates, rows)[0]

    # mlx-lm reads all but the prompt's last token in chunks; the last one goes through the
    # first decode step, which gives the first token (generate_step, BatchGenerator alike).
    read = prompt_tokens - 1
    total = sum(
        step(min(PREFILL_CHUNK, read - start), min(read, start + PREFILL_CHUNK))
        for start in range(0, read, PREFILL_CHUNK)
    )
    return total + step(1, prompt_tokens)
