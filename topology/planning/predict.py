"""Step time from first principles. Each rank's time in a phase is the larger of its memory
time (bytes read / (bandwidth × decoding's efficiency)) and its compute time (floating-point
operations × rows / its measured matmul throughput at that row count: the weights' kind for
theirs, the activations' dtype for attention's scores), on a CPU plus its layers'
small ops and exp-type passes (SiLU, softmax: elements × rows × their measured cost), plus the
collectives the strategy needs. Never above the memory-bandwidth roofline.

tensor:   t = sum over phases(max over ranks(phase time)) + 2 all-reduces per layer
          + step overhead (phases: attention, MLP or experts, the LM head); on a CPU a phase
          also waits for crowded cores (more ranks than cores) or for the slower rank's pieces
pipeline: t = sum over stages(stage time) + the LM head (every rank computes it)
              + one hand-off per stage boundary + the final all_gather + step overhead
Decode is 1 row a step; a prefill chunk is up to PREFILL_CHUNK rows. The share of bandwidth
decoding reaches and the step overhead are fitted to published figures (topology/chips.py,
scripts/calibrate_prediction.py); compute comes only from a host's microbenchmark
(topology/host_rates.py): a host never measured is modelled by its memory alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topology.chips import DECODE_BANDWIDTH_EFFICIENCY, BackendCost, step_overhead_s
from topology.model.spec import ModelSpec
from topology.planning.tensor_costs import RankCost, phase_seconds


def _message_bytes(spec: ModelSpec) -> int:
    """One token's hidden state: what each all-reduce / hand-off carries during decode."""
    return spec.hidden * spec.activation_bytes  # a float32 model's: 4 bytes an element


def stage_read_bytes(spec: ModelSpec, layers: tuple[int, int], context: int) -> float:
    """Bytes a pipeline stage reads per token for its layers [start, end) (head excluded)."""
    start, end = layers
    weights = sum(c.active for c in spec.layer_costs()[start:end])
    linear = sum(spec.is_linear(i) for i in range(start, end))
    # a KV cache is read over the context; a linear-attention state is read and written whole
    caches = spec.cache_bytes(start, end, context) + linear * spec.linear_state_bytes_per_layer
    return weights + caches


PREFILL_CHUNK = 512  # rows a prefill step runs (and the microbenchmark's largest row count)
# How long a crowded CPU core runs one rank's piece before another's: a piece this short or
# shorter runs to its end. Measured here (3 ranks on 2 cores, a chain of share matmuls with
# all-reduces): pieces of 5 and 19 ms took 1.86x and 1.75x their time alone, pieces under
# 1.5 ms 2.0x; n / c alone would be 1.5x. README, Planning: held to it.
SCHEDULER_SLICE_S = 0.006
# What tensor ranks computing at once on CPU cores of their own lose to each other beyond the
# all-reduces' own time: every piece between two all-reduces waits for the slower rank's (a
# chain of float32 share matvecs on 2 ranks here, 12 layers, hidden 512, 1024 and 2048: 8, 8
# and 5.5 % of the pieces' time; the same pieces on both cores without all-reduces: 0-2 %).
# Crowded cores' pieces (SCHEDULER_SLICE_S) were measured with it; a GPU's fitted overhead holds it.
LOCKSTEP_WAIT = 0.07


@dataclass(frozen=True)
class RankRate:
    """What a rank computes at a step's row count, when its host was measured."""

    gflops: float | None = None  # None: not measured (memory alone)
    # False on a CPU: its measured matmul streamed a weight from memory as decoding does, so
    # the rate holds the memory time; a copy's bandwidth there says less (measured 3.6 GB/s
    # against 6 GB/s read by a decoding float32 model).
    memory: bool = True
    # A CPU's work besides the matmuls (host_rates.HostRates.layer_costs): seconds of a layer's
    # small ops a step, and seconds per element of an exp-type pass; 0 where not modelled.
    layer_s: float = 0.0
    exp_s: float = 0.0
    # Activations times activations (attention's scores) in their own dtype: a quantized
    # model's run at its float rate, not its weights' (on a CPU 2.3 against 158 GFLOP/s for
    # float32 activations); None: the weights' rate.
    activation_gflops: float | None = None
    # (fair, whole): how many times its time alone this rank's work takes where more ranks
    # than cores compute at once (host_rates.HostRates.crowding); the rates hold the fair one.
    crowding: tuple[float, float] = (1.0, 1.0)

    def waits_s(self, busy: float, pieces: int, lockstep: bool = False) -> float:
        """What `pieces` pieces of work between all-reduces (`busy` seconds at the fair share)
        wait beyond that share on a CPU. On crowded cores a piece within the scheduler's slice
        runs to its end on one core, so n pieces on c cores end after ceil(n / c) of them; a
        longer one is cut into slices shared evenly and waits only for about one slice. On
        cores of its own, in `lockstep` with other ranks, each piece waits for the slower one's
        (LOCKSTEP_WAIT; crowded pieces were measured with it)."""
        fair, whole = self.crowding
        if pieces <= 0 or busy <= 0:
            return 0.0
        if whole > fair:
            return pieces * (whole - fair) * min(busy / fair / pieces, SCHEDULER_SLICE_S)
        cpu = bool(self.gflops) and not self.memory  # a GPU's fitted overhead holds the wait
        return LOCKSTEP_WAIT * busy if lockstep and cpu else 0.0

    def other_s(self, layers: int, exp_elements: float, rows: int) -> float:
        """Seconds a step of `rows` spends besides matmuls in `layers` layers whose exp-type
        passes cover `exp_elements` a row."""
        return layers * self.layer_s + rows * exp_elements * self.exp_s


def busy_s(
    memory_s: float,
    flops: float,
    rate: RankRate | None = None,
    rows: int = 1,
    activation_flops: float = 0.0,
) -> float:
    """One rank's time in one phase: memory-bound or compute-bound, whichever is slower."""
    memory = memory_s / DECODE_BANDWIDTH_EFFICIENCY
    if rate is None or not rate.gflops:
        return memory
    compute = rows * flops / (rate.gflops * 1e9)
    compute += rows * activation_flops / ((rate.activation_gflops or rate.gflops) * 1e9)
    return max(memory, compute) if rate.memory else compute


def tensor_phases(
    costs: Sequence[RankCost],
    bandwidths_gbs: Sequence[float],
    rates: Sequence[RankRate] | None = None,
    rows: int = 1,
) -> list[list[float]]:
    """Per phase (attention, MLP, head), each rank's predicted seconds for a step of `rows`."""
    rates = rates or [RankRate()] * len(costs)
    out = []
    for i, phase in enumerate(phase_seconds(costs, bandwidths_gbs)):
        times = []
        for m, c, g in zip(phase, costs, rates, strict=True):
            t = busy_s(m, c.flops[i], g, rows, c.activation_flops if i == 0 else 0.0)
            t += g.other_s(c.layers if i == 0 else 0, c.exp_elements[i], rows)
            pieces = c.layers if i < 2 else 1  # the head: one piece
            times.append(t + g.waits_s(t, pieces, lockstep=len(costs) > 1))
        out.append(times)
    return out


def tensor_seconds(
    spec: ModelSpec,
    costs: Sequence[RankCost],
    bandwidths_gbs: Sequence[float],
    cost: BackendCost,
    rates: Sequence[RankRate] | None = None,
    rows: int = 1,
) -> tuple[float, float]:
    """(predicted, roofline) seconds a step of `rows` for tensor parallel: each phase
    (attention, MLP, the head) lasts as long as its slowest rank, then the all-reduces."""
    roofline = sum(max(phase) for phase in phase_seconds(costs, bandwidths_gbs))
    busy = sum(max(phase) for phase in tensor_phases(costs, bandwidths_gbs, rates, rows))
    return busy + tensor_comms_s(spec, len(costs), cost, rows), roofline


def tensor_comms_s(spec: ModelSpec, n: int, cost: BackendCost, rows: int = 1) -> float:
    """A step's all-reduces over n tensor ranks (2 per layer) and the step's own overhead."""
    message = rows * _message_bytes(spec)
    overhead = 0.0 if cost.in_steps else step_overhead_s(n)
    return 2 * spec.layers * cost.all_reduce_s(n, message) + overhead


def stage_flops(spec: ModelSpec, layers: tuple[int, int], context: int) -> tuple[float, float]:
    """Floating-point operations a token (one row) in a pipeline stage's layers: (of its
    weights, of activations with activations: the scores and values over the context)."""
    start, end = layers
    weights = sum(c.active for c in spec.layer_costs()[start:end])
    scores = 4 * spec.heads * spec.head_dim * context * (end - start)
    return 2 * weights / (spec.param_bytes(spec.bits) * spec.scale), scores


def stage_exp_elements(spec: ModelSpec, layers: tuple[int, int], context: int) -> float:
    """Elements of exp-type passes a row in a stage's layers: softmax over every head's scores,
    SiLU over the MLP or the routed and shared experts (and the router's softmax)."""
    start, end = layers
    total = 0.0
    for i in range(start, end):
        if not spec.is_linear(i):
            total += spec.heads_at(i)[0] * spec.cached_tokens(i, context)
        if i in spec.sparse_layers:
            routed = spec.experts_per_token * (spec.moe_intermediate or spec.intermediate)
            total += routed + spec.shared_intermediate + spec.experts
        else:
            total += spec.intermediate
    return total


def pipeline_seconds(
    spec: ModelSpec,
    stages: Sequence[tuple[int, int]],
    bandwidths_gbs: Sequence[float],
    cost: BackendCost,
    context: int,
    rates: Sequence[RankRate] | None = None,
    rows: int = 1,
) -> tuple[float, float]:
    """(predicted, roofline) seconds a step of `rows`; stages[r] = rank r's layers [start, end)."""
    n = len(stages)
    rates = rates or [RankRate()] * n
    head = spec.outside_layers_active_bytes
    head_flops = 2 * head / (spec.param_bytes(spec.bits) * spec.scale)
    stage_mem = [
        stage_read_bytes(spec, s, context) / (bw * 1e9)
        for s, bw in zip(stages, bandwidths_gbs, strict=True)
    ]
    head_mem = [head / (bw * 1e9) for bw in bandwidths_gbs]
    roofline = sum(stage_mem) + max(head_mem)
    busy = 0.0
    for m, s, g in zip(stage_mem, stages, rates, strict=True):
        weights, activations = stage_flops(spec, s, context)
        busy += busy_s(m, weights, g, rows, activations)
        busy += g.other_s(s[1] - s[0], stage_exp_elements(spec, s, context), rows)
    busy += max(busy_s(m, head_flops, g, rows) for m, g in zip(head_mem, rates, strict=True))
    comms = 0.0
    if n > 1:
        msg = rows * _message_bytes(spec)
        if cost.pipeline_step_s is not None:  # measured in steps: the hand-offs' bytes added
            comms = cost.pipeline_step_s + 2 * (n - 1) * msg / cost.link_bytes_per_s
        else:
            comms = (n - 1) * cost.hand_off_s(msg) + cost.all_reduce_s(n, msg) + step_overhead_s(n)
    return busy + comms, roofline


def tok_s(seconds: float) -> float:
    return round(1.0 / seconds, 2) if seconds > 0 else 0.0
