"""How much of each rank's memory `serve` may give the prefix cache, in bytes and in tokens.

The ranks bound their prefix cache in tokens, not bytes: every rank must evict the same entries
at the same step, yet pipeline stages (and MLA under tensor parallelism) hold different bytes
per token. So a byte budget becomes a token count on the rank that holds the most KV bytes per
token, and no rank goes over the budget. Pure: a plan and a model spec in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.chips import GIB
from topology.model.spec import ModelSpec
from topology.planning.types import Plan, RankPlan

# The default budget: half of the tightest rank's headroom (usable memory minus what the plan
# already needs: weights, the planned context's KV cache, the planner's margin), at most 8 GiB.
HEADROOM_SHARE = 0.5
MAX_DEFAULT_BYTES = 8 * GIB
# A rank whose memory is unknown (a Linux host without wired_limit_gb): a modest guess.
UNKNOWN_MEMORY_BYTES = GIB


@dataclass(frozen=True)
class PrefixCacheBudget:
    bytes: int  # what was asked (or the default), on each rank
    tokens: int  # what the ranks are told: bytes / kv_bytes_per_token
    kv_bytes_per_token: int  # on the rank holding the most KV per token


def rank_kv_bytes_per_token(plan: Plan, rank: RankPlan, spec: ModelSpec) -> int:
    """KV cache bytes one token costs on this rank: its layers' share, split over the tensor
    ranks (MLA's latent is not split: mlx-lm's shard() keeps it whole on every rank)."""
    layers = rank.layers[1] - rank.layers[0]
    ways = len(plan.ranks) if plan.strategy == "tensor" and not spec.is_mla else 1
    return -(-spec.kv_bytes_per_token_per_layer * layers // ways)  # rounded up: never over


def headroom_bytes(rank: RankPlan) -> int | None:
    """Usable memory left on this rank once the plan's needs are met; None when unknown."""
    if rank.memory_usable_bytes is None:
        return None
    return max(0, rank.memory_usable_bytes - rank.memory_needed_bytes)


def default_prefix_cache_bytes(plan: Plan) -> int:
    """Half the smallest known headroom, capped; a modest guess when no memory is known."""
    known = [h for h in (headroom_bytes(r) for r in plan.ranks) if h is not None]
    if not known:
        return UNKNOWN_MEMORY_BYTES if plan.ranks else 0
    return min(MAX_DEFAULT_BYTES, int(min(known) * HEADROOM_SHARE))


def prefix_cache_budget(
    plan: Plan, spec: ModelSpec, requested_bytes: int | None
) -> PrefixCacheBudget:
    """The budget for this plan: `requested_bytes` (None: the default from the headroom; 0: off)
    as a token count every rank can hold."""
    size = default_prefix_cache_bytes(plan) if requested_bytes is None else requested_bytes
    size = max(0, size)
    per_token = max((rank_kv_bytes_per_token(plan, r, spec) for r in plan.ranks), default=0)
    tokens = size // per_token if per_token > 0 else 0
    return PrefixCacheBudget(size, tokens, per_token)
