"""Decode speed from first principles: bytes each rank reads per token over its bandwidth,
plus the collectives the strategy needs. Never above the memory-bandwidth roofline.

tensor:   t = sum over phases(max over ranks(bytes read / bandwidth)) + 2 all-reduces per layer
          + step overhead (phases: attention, MLP or experts, the LM head)
pipeline: t = sum over stages(bytes read / bandwidth) + the LM head (every rank computes it)
              + one hand-off per stage boundary + the final all_gather + step overhead
The share of bandwidth decoding reaches and the step overhead are fitted to published figures
(topology/chips.py, scripts/calibrate_prediction.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from topology.chips import DECODE_BANDWIDTH_EFFICIENCY, BackendCost, step_overhead_s
from topology.model.spec import KV_CACHE_DTYPE_BYTES, ModelSpec
from topology.planning.tensor_costs import RankCost, phase_seconds


def _message_bytes(spec: ModelSpec) -> int:
    """One token's hidden state: what each all-reduce / hand-off carries during decode."""
    return spec.hidden * KV_CACHE_DTYPE_BYTES


def stage_read_bytes(spec: ModelSpec, layers: tuple[int, int], context: int) -> float:
    """Bytes a pipeline stage reads per token for its layers [start, end) (head excluded)."""
    start, end = layers
    weights = sum(c.active for c in spec.layer_costs()[start:end])
    return weights + spec.kv_bytes_per_token_per_layer * (end - start) * context


def tensor_seconds(
    spec: ModelSpec, costs: Sequence[RankCost], bandwidths_gbs: Sequence[float], cost: BackendCost
) -> tuple[float, float]:
    """(predicted, roofline) seconds per token for tensor parallel: each phase (attention, MLP,
    the head) lasts as long as its slowest rank, then the all-reduces."""
    roofline = sum(max(phase) for phase in phase_seconds(costs, bandwidths_gbs))
    return roofline / DECODE_BANDWIDTH_EFFICIENCY + tensor_comms_s(spec, len(costs), cost), roofline


def tensor_comms_s(spec: ModelSpec, n: int, cost: BackendCost) -> float:
    """A token's all-reduces over n tensor ranks (2 per layer) and the step's own overhead."""
    return 2 * spec.layers * cost.all_reduce_s(n, _message_bytes(spec)) + step_overhead_s(n)


def pipeline_seconds(
    spec: ModelSpec,
    stages: Sequence[tuple[int, int]],
    bandwidths_gbs: Sequence[float],
    cost: BackendCost,
    context: int,
) -> tuple[float, float]:
    """(predicted, roofline) seconds per token; stages[r] = rank r's layers [start, end)."""
    n = len(stages)
    head = spec.outside_layers_active_bytes
    roofline = sum(
        stage_read_bytes(spec, s, context) / (bw * 1e9)
        for s, bw in zip(stages, bandwidths_gbs, strict=True)
    ) + max(head / (bw * 1e9) for bw in bandwidths_gbs)
    comms = 0.0
    if n > 1:
        msg = _message_bytes(spec)
        comms = (n - 1) * cost.hand_off_s(msg) + cost.all_reduce_s(n, msg) + step_overhead_s(n)
    return roofline / DECODE_BANDWIDTH_EFFICIENCY + comms, roofline


def tok_s(seconds: float) -> float:
    return round(1.0 / seconds, 2) if seconds > 0 else 0.0
