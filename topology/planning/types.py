"""The plan's data: per-rank placement and the whole plan, as plan.json stores it."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topology.facts import Problem
from topology.untrusted import show

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
    # tensor: this rank's heads and widths as the rank reads them (tensor_shares.RankShare)
    tensor_share: Mapping[str, Any] | None = None
    share_summary: Mapping[str, Any] = field(default_factory=dict)  # heads, KV heads, widths
    read_bytes_per_token: int = 0
    predicted_step_s: float = 0.0  # this rank's own time a token, its waits on others excluded

    def to_json(self) -> dict[str, Any]:
        tensor = {}
        if self.tensor_share is not None:
            tensor = {
                "tensor_share": dict(self.tensor_share),
                **self.share_summary,
                "read_bytes_per_token": self.read_bytes_per_token,
                "predicted_step_s": self.predicted_step_s,
            }
        return tensor | {
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
    prompt_tokens: int = 0  # the prompt the prefill figures are for
    predicted_ttft_s: float | None = None  # None: a host's compute was not measured
    predicted_prefill_tok_s: float | None = None
    # what the prefill figures rest on: "measured" (rates.json), "assumed" (the chip table),
    # "mixed"; None with them
    compute_source: str | None = None

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
            "prompt_tokens": self.prompt_tokens,
            "predicted_ttft_s": self.predicted_ttft_s,
            "predicted_prefill_tok_s": self.predicted_prefill_tok_s,
            "compute_source": self.compute_source,
            "reason": self.reason,
            "problems": [p.to_json() for p in self.problems],
            "assumptions": list(self.assumptions),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Plan:
        """Read back what to_json wrote (plan.json); KeyError/TypeError/ValueError on anything
        else. plan.json is a file on disk: every value a launch acts on is checked."""
        ranks_raw, problems_raw = raw["ranks"], raw["problems"]
        if not isinstance(ranks_raw, list) or len(ranks_raw) > _MAX_RANKS:
            raise ValueError(f"ranks: must be a list of at most {_MAX_RANKS} ranks")
        if not isinstance(problems_raw, list):
            raise TypeError("problems: must be a list")
        ranks = tuple(_rank(i, r) for i, r in enumerate(ranks_raw))
        problems = tuple(Problem(**{**p, "hosts": tuple(p["hosts"])}) for p in problems_raw)
        strategy, backend = raw["strategy"], raw["backend"]
        if strategy not in ("auto", "tensor", "pipeline"):
            raise ValueError(f"strategy: {show(strategy)} is not tensor or pipeline")
        if backend not in (None, "jaccl", "jaccl-ring", "ring"):
            raise ValueError(f"backend: {show(backend)} is not jaccl, jaccl-ring or ring")
        if not isinstance(raw["model"], str):
            raise TypeError("model: must be a string")
        return cls(
            strategy=strategy,
            backend=backend,
            model=raw["model"],
            ranks=ranks,
            predicted_decode_tok_s=raw["predicted_decode_tok_s"],
            reason=str(raw["reason"]),
            problems=problems,
            context=_int(raw.get("context", DEFAULT_CONTEXT), "context", 1, 16 << 20),
            local=raw.get("local", False) is True,
            assumptions=tuple(str(a) for a in raw.get("assumptions", ())),
            roofline_decode_tok_s=raw.get("roofline_decode_tok_s"),
            model_info=raw.get("model_info", {}),
            prompt_tokens=_int(raw.get("prompt_tokens", 0), "prompt_tokens", 0, 16 << 20),
            predicted_ttft_s=_seconds(raw.get("predicted_ttft_s"), "predicted_ttft_s"),
            predicted_prefill_tok_s=_seconds(
                raw.get("predicted_prefill_tok_s"), "predicted_prefill_tok_s"
            ),
            compute_source=_compute_source(raw.get("compute_source")),
        )


_MAX_RANKS = 1024
_MAX_BYTES = 1 << 60
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _int(value: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{key}: must be a whole number from {lo} to {hi}, got {show(value)}")
    return value


def _ip(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9A-Fa-f.:]{2,45}", value):
        raise ValueError(f"{key}: {show(value)} is not an IP address")
    ipaddress.ip_address(value)  # ValueError when it is not one
    return value


def _rank(i: int, r: Any) -> RankPlan:
    if not isinstance(r, Mapping):
        raise TypeError(f"ranks[{i}]: must be an object")
    layers = r["layers"]
    if not isinstance(layers, list) or len(layers) != 2:
        raise ValueError(f"ranks[{i}].layers: must be [start, end]")
    start = _int(layers[0], f"ranks[{i}].layers", 0, 1024)
    end = _int(layers[1], f"ranks[{i}].layers", start, 1024)
    host = r["host"]
    if not isinstance(host, str) or not _NAME.fullmatch(host):
        raise ValueError(f"ranks[{i}].host: {show(host)} is not a host name")
    usable = r.get("memory_usable_bytes")
    return RankPlan(
        rank=_int(r["rank"], f"ranks[{i}].rank", i, i),
        host=host,
        layers=(start, end),
        ip=_ip(r["ip"], f"ranks[{i}].ip"),
        memory_needed_bytes=_int(r["memory_needed_bytes"], "memory_needed_bytes", 0, _MAX_BYTES),
        memory_usable_bytes=None if usable is None else _int(usable, "usable", 0, _MAX_BYTES),
        ssh=str(r.get("ssh", "")),
        weight_bytes=_int(r.get("weight_bytes", 0), "weight_bytes", 0, _MAX_BYTES),
        kv_cache_bytes=_int(r.get("kv_cache_bytes", 0), "kv_cache_bytes", 0, _MAX_BYTES),
        bandwidth_gbs=float(r.get("bandwidth_gbs", 0.0)),
        tensor_share=_share(r.get("tensor_share"), f"ranks[{i}].tensor_share"),
        share_summary=_summary(r, f"ranks[{i}]"),
        read_bytes_per_token=_int(r.get("read_bytes_per_token", 0), "read_bytes", 0, _MAX_BYTES),
        predicted_step_s=float(r.get("predicted_step_s", 0.0)),
    )


_SUMMARY = (
    "heads", "kv_heads", "attention_calls", "mlp_width", "expert_width", "shared_width",
    "linear_width", "other_heads", "other_kv_heads", "other_attention_calls",
)  # fmt: skip


def _summary(r: Mapping[str, Any], key: str) -> dict[str, Any]:
    """What to_json spread from share_summary beside the share (plan.json's own fields)."""
    if r.get("tensor_share") is None:
        return {}
    out: dict[str, Any] = {
        name: _int(r[name], f"{key}.{name}", 0, 1 << 24) for name in _SUMMARY if name in r
    }
    if "kv_replicated" in r:
        out["kv_replicated"] = r["kv_replicated"] is True
    return out


COMPUTE_SOURCES = ("measured", "assumed", "mixed")


def _compute_source(value: Any) -> str | None:
    if value is not None and value not in COMPUTE_SOURCES:
        raise ValueError(f"compute_source: {show(value)} is not measured, assumed or mixed")
    return value


def _seconds(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"{key}: must be a number >= 0 or null")
    return float(value)


def _share(value: Any, key: str) -> dict[str, Any] | None:
    """A tensor share's shape (the rank checks its ranges against the model)."""
    if value is None:
        return None
    widths = {"mlp", "expert", "shared", "linear"}  # linear: Qwen3.5's linear attention
    blocks = {"attention", "attention_other"}  # attention_other: Step-3.5's sliding layers
    if not isinstance(value, Mapping) or set(value) - {*blocks, *widths}:
        raise ValueError(
            f"{key}: must be an object of attention(_other) blocks and mlp, expert, shared, linear"
        )
    out: dict[str, Any] = {}
    for name, span in value.items():
        if name in blocks:
            if not isinstance(span, list) or not all(
                isinstance(b, list) and len(b) == 4 for b in span
            ):
                raise ValueError(f"{key}.{name}: must be a list of [kv, kv, col, col] blocks")
            out[name] = [[_int(v, f"{key}.{name}", 0, 1 << 24) for v in b] for b in span]
            continue
        if not isinstance(span, list) or len(span) != 2:
            raise ValueError(f"{key}.{name}: must be [start, end]")
        out[name] = [_int(v, f"{key}.{name}", 0, 1 << 24) for v in span]
    return out
