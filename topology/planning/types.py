"""The plan's data: per-rank placement and the whole plan, as plan.json stores it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topology.facts import Problem

DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class RankPlan:
    rank: int
    host: str
    layers: tuple[int, int]  # [start, end): tensor ranks hold a slice of every layer
    ip: str | None
    memory_needed_bytes: int
    memory_usable_bytes: int | None
    ssh: str = ""
    weight_bytes: int = 0
    kv_cache_bytes: int = 0
    bandwidth_gbs: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "layers": list(self.layers),
            "ip": self.ip,
            "ssh": self.ssh,
            "memory_needed_bytes": self.memory_needed_bytes,
            "memory_usable_bytes": self.memory_usable_bytes,
            "weight_bytes": self.weight_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "bandwidth_gbs": self.bandwidth_gbs,
        }


@dataclass(frozen=True)
class Plan:
    strategy: str  # "tensor" | "pipeline"; what was asked ("auto" too) when no plan is valid
    backend: str | None
    model: str  # the model as given: a local directory or a Hugging Face repo id
    ranks: tuple[RankPlan, ...]  # empty when no valid plan exists
    predicted_decode_tok_s: float | None
    reason: str
    problems: tuple[Problem, ...] = ()
    context: int = DEFAULT_CONTEXT
    local: bool = False  # --local N: every rank on this machine
    assumptions: tuple[str, ...] = ()
    roofline_decode_tok_s: float | None = None
    model_info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and not any(p.severity == "error" for p in self.problems)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def layer_split(self) -> tuple[int, ...] | None:
        """Pipeline: layers per rank in rank order (mlx-lm's `split`); None for tensor."""
        if self.strategy != "pipeline" or not self.ranks:
            return None
        return tuple(r.layers[1] - r.layers[0] for r in self.ranks)

    def to_json(self) -> dict[str, Any]:
        split = self.layer_split
        return {
            "strategy": self.strategy,
            "backend": self.backend,
            "model": self.model,
            "model_info": dict(self.model_info),
            "context": self.context,
            "local": self.local,
            "world_size": self.world_size,
            "layer_split": list(split) if split else None,
            "ranks": [r.to_json() for r in self.ranks],
            "predicted_decode_tok_s": self.predicted_decode_tok_s,
            "roofline_decode_tok_s": self.roofline_decode_tok_s,
            "reason": self.reason,
            "problems": [p.to_json() for p in self.problems],
            "assumptions": list(self.assumptions),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Plan:
        """Read back what to_json wrote (plan.json); KeyError/TypeError on anything else."""
        ranks = tuple(RankPlan(**{**r, "layers": tuple(r["layers"])}) for r in raw["ranks"])
        problems = tuple(Problem(**{**p, "hosts": tuple(p["hosts"])}) for p in raw["problems"])
        return cls(
            strategy=raw["strategy"],
            backend=raw["backend"],
            model=raw["model"],
            ranks=ranks,
            predicted_decode_tok_s=raw["predicted_decode_tok_s"],
            reason=raw["reason"],
            problems=problems,
            context=raw.get("context", DEFAULT_CONTEXT),
            local=raw.get("local", False),
            assumptions=tuple(raw.get("assumptions", ())),
            roofline_decode_tok_s=raw.get("roofline_decode_tok_s"),
            model_info=raw.get("model_info", {}),
        )
