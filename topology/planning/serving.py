"""How much of each rank's memory `serve` may give the prefix cache, in bytes and in tokens.

The ranks bound their prefix cache in tokens, not bytes: every rank must evict the same entries
at the same step, yet pipeline stages (and MLA under tensor parallelism) hold different bytes
per token. So a byte budget becomes a token count on the rank that holds the most KV bytes per
token, and no rank goes over the budget. Pure: a plan and a model spec in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topology.chips import GIB
from topology.model.spec import ModelSpec
from topology.planning.options import gib
from topology.planning.placement import HEADROOM_BYTES, HEADROOM_FRACTION
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
    """KV cache bytes one token costs on this rank: its layers' share, or its tensor share's
    KV heads (replicas counted; MLA's latent is whole on every rank)."""
    if plan.strategy == "tensor" and rank.tensor_share is not None:  # its own KV heads' cache
        return -(-rank.kv_cache_bytes // plan.context)
    start, end = rank.layers
    layers = sum(not spec.is_linear(i) for i in range(start, end))  # a linear state is fixed
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


# --- the KV memory budget (serve's admission) ----------------------------------------------------


def margin_bytes(rank: RankPlan) -> int:
    """The planner's margin beyond weights and KV (prefill steps, the allocator's cache)."""
    return int(rank.weight_bytes * HEADROOM_FRACTION) + HEADROOM_BYTES


@dataclass(frozen=True)
class RankBudget:
    """One rank's memory, as the budget splits it (bytes; usable None: not known)."""

    rank: int
    host: str
    usable_bytes: int | None
    weight_bytes: int
    margin_bytes: int
    prefix_cache_bytes: int
    kv_bytes_per_token: int

    @property
    def kv_budget_bytes(self) -> int | None:
        """Usable memory minus weights, margin and the prefix cache's share."""
        if self.usable_bytes is None:
            return None
        left = self.usable_bytes - self.weight_bytes - self.margin_bytes
        return left - self.prefix_cache_bytes

    @property
    def kv_budget_tokens(self) -> int | None:
        budget = self.kv_budget_bytes
        if budget is None or self.kv_bytes_per_token <= 0:
            return None
        return max(0, budget) // self.kv_bytes_per_token

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "usable_bytes": self.usable_bytes,
            "weight_bytes": self.weight_bytes,
            "margin_bytes": self.margin_bytes,
            "prefix_cache_bytes": self.prefix_cache_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_budget_tokens": self.kv_budget_tokens,
        }


@dataclass(frozen=True)
class MemoryBudget:
    """What serve admits by: every rank's KV budget, in tokens on the tightest rank. The prefix
    cache's share is lent to running sequences when they need it (it evicts first), so a request
    may use up to `limit_tokens`. None: no rank's memory is known (admission by count only)."""

    ranks: tuple[RankBudget, ...]
    prefix_cache_tokens: int

    @property
    def tight(self) -> RankBudget | None:
        """The rank that holds the fewest tokens of KV (None: no memory known)."""
        known = [r for r in self.ranks if r.kv_budget_tokens is not None]
        return min(known, key=lambda r: (r.kv_budget_tokens or 0, r.rank), default=None)

    @property
    def kv_budget_tokens(self) -> int | None:
        tight = self.tight
        return None if tight is None else tight.kv_budget_tokens

    @property
    def limit_tokens(self) -> int | None:
        """The most KV the running sequences may hold once the prefix cache gave its share
        back: the budget plus that share (in tokens, the share counted on the heaviest rank)."""
        budget = self.kv_budget_tokens
        return None if budget is None else budget + self.prefix_cache_tokens

    def job_options(self) -> dict[str, Any]:
        """What rank 0's scheduler admits by (cluster/serve/loop.py reads it)."""
        if self.limit_tokens is None:
            return {}
        return {"kv_budget_tokens": self.kv_budget_tokens, "kv_limit_tokens": self.limit_tokens}

    def to_json(self) -> dict[str, Any]:
        tight = self.tight
        return {
            "kv_budget_tokens": self.kv_budget_tokens,
            "prefix_cache_tokens": self.prefix_cache_tokens,
            "limit_tokens": self.limit_tokens,
            "tightest_rank": None if tight is None else tight.rank,
            "ranks": [r.to_json() for r in self.ranks],
        }

    def describe(self) -> str:
        """One line for serve's start: the budget and where it comes from."""
        tight = self.tight
        if tight is None or tight.usable_bytes is None:
            return "KV memory budget: unknown (no rank's memory is known): admitting by count only"
        return (
            f"KV memory budget: {self.kv_budget_tokens:,} tokens (rank {tight.rank} on "
            f"{tight.host}: {gib(tight.usable_bytes)} usable − {gib(tight.weight_bytes)} weights − "
            f"{gib(tight.margin_bytes)} margin − {gib(tight.prefix_cache_bytes)} prefix cache = "
            f"{gib(tight.kv_budget_bytes or 0)} at {tight.kv_bytes_per_token:,} bytes/token); "
            f"up to {self.limit_tokens:,} when the prefix cache gives its share back"
        )


def memory_budget(plan: Plan, spec: ModelSpec, prefix: PrefixCacheBudget) -> MemoryBudget:
    """Every rank's KV budget from the plan: usable memory − weights − margin − prefix share."""
    ranks = tuple(
        RankBudget(
            rank=r.rank,
            host=r.host,
            usable_bytes=r.memory_usable_bytes,
            weight_bytes=r.weight_bytes,
            margin_bytes=margin_bytes(r),
            prefix_cache_bytes=prefix.bytes,
            kv_bytes_per_token=rank_kv_bytes_per_token(plan, r, spec),
        )
        for r in plan.ranks
    )
    return MemoryBudget(ranks, prefix.tokens)


def budget_error(budget: MemoryBudget) -> str | None:
    """One line when a rank has no KV budget at all (the prefix cache's share took it)."""
    for r in budget.ranks:
        left = r.kv_budget_bytes
        if left is not None and r.usable_bytes is not None and left <= 0:
            return (
                f"rank {r.rank} on {r.host} has no memory for KV caches: {gib(r.usable_bytes)} "
                f"usable − {gib(r.weight_bytes)} weights − {gib(r.margin_bytes)} margin − "
                f"{gib(r.prefix_cache_bytes)} prefix cache = {gib(left)}; give a smaller "
                "--prefix-cache-gb"
            )
    return None
