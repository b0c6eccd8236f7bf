"""The readable `mlx-cluster plan` output: strategy, per-rank table, prediction, problems."""

from __future__ import annotations

from collections.abc import Sequence

from topology.planning.options import gib
from topology.planning.plan import Plan, RankPlan

# How far to trust the prefill figure: a measured rate, or the chip table's assumption.
_SOURCE = {
    "measured": " (compute measured)",
    "assumed": " (compute assumed from the chip table, not measured)",
    "mixed": " (compute measured on some hosts, assumed from the chip table on others)",
}


def _layers(plan: Plan, r: RankPlan) -> str:
    start, end = r.layers
    if plan.strategy == "tensor" and plan.world_size > 1:
        return f"all {end - start}"
    return f"{start}-{end - 1} ({end - start})"


def _share(r: RankPlan) -> str:
    """A tensor rank's slice of each layer: heads, KV heads (replicated or not), widths."""
    s = r.share_summary
    if not s:
        return "-"
    kv = f"{s['kv_heads']} KV" + (" (replicated)" if s.get("kv_replicated") else "")
    widths = [f"{name.removesuffix('_width')} {s[name]}" for name in s if name.endswith("_width")]
    parts = [_heads(s["heads"], s.get("attention_calls", 1), ""), kv]
    if "other_heads" in s:  # Step-3.5's sliding layers, with head counts of their own
        sliding = _heads(s["other_heads"], s.get("other_attention_calls", 1), "sliding ")
        parts += [sliding, f"{s.get('other_kv_heads')} sliding KV"]
    return ", ".join([*parts, *widths])


def _heads(count: object, calls: object, kind: str) -> str:
    many = isinstance(calls, int) and calls > 1
    return f"{count} {kind}heads" + (f" in {calls} calls" if many else "")


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def plan_text(plan: Plan) -> str:
    info = plan.model_info
    lines = []
    if plan.ok:
        where = "this machine" if plan.local else f"{plan.world_size} host(s)"
        lines.append(
            f"Plan: {plan.strategy} parallel, {plan.world_size} rank(s) on {where}, "
            f"backend {plan.backend}"
        )
    else:
        lines.append("No valid plan.")
    if info:
        lines.append(
            f"Model: {plan.model} ({info.get('model_type')}, {info.get('layers')} layers, "
            f"{info.get('quantization')}, {gib(float(info.get('weight_bytes', 0)))} of weights, "
            f"{gib(float(info.get('active_bytes_per_token', 0)))} read per token), "
            f"context {plan.context} tokens"
        )
    if plan.predicted_decode_tok_s is not None:
        roof = plan.roofline_decode_tok_s
        extra = f" (memory-bandwidth roofline {roof:.1f} tok/s)" if roof else ""
        lines.append(f"Predicted decode: {plan.predicted_decode_tok_s:.1f} tok/s{extra}")
        if plan.predicted_ttft_s is not None and plan.predicted_prefill_tok_s is not None:
            lines.append(
                f"Predicted prefill: {plan.predicted_prefill_tok_s:.1f} tok/s, first token after "
                f"{plan.predicted_ttft_s:.2f} s for a {plan.prompt_tokens}-token prompt"
                + _SOURCE.get(plan.compute_source or "", "")
            )
        else:
            lines.append(
                "Predicted prefill: not predicted (a host's compute was not measured and its "
                "chip is not in the chip table)"
            )
    lines.append(f"Why: {plan.reason}")
    if plan.ranks:
        shares = any(r.share_summary for r in plan.ranks)
        rows = [["rank", "host", "address", "layers", "weights", "KV cache", "needed", "usable"]]
        if shares:
            rows[0] += ["share of each layer", "read/token", "step"]
        rows += [
            [
                str(r.rank), r.host, r.ip or "-", _layers(plan, r), gib(r.weight_bytes),
                gib(r.kv_cache_bytes), gib(r.memory_needed_bytes),
                gib(r.memory_usable_bytes) if r.memory_usable_bytes is not None else "?",
            ] + ([_share(r), gib(r.read_bytes_per_token), f"{r.predicted_step_s * 1e3:.1f} ms"]
                 if shares else [])
            for r in plan.ranks
        ]  # fmt: skip
        lines += ["", *_table(rows)]
        if shares:
            lines.append(
                "  (shares follow each host's memory bandwidth, or its measured compute where that"
                " binds; step: the rank's own time a token)"
            )
        if plan.strategy == "pipeline":
            lines.append("  (rank 0 runs the last layers, as mlx-lm's pipeline orders them)")
    if plan.problems:
        lines += ["", "Problems:"]
        for p in plan.problems:
            lines.append(f"  {p.severity} {p.code}: {p.message}")
            lines.append(f"    fix: {p.fix}")
    if plan.assumptions:
        lines += ["", "Assumptions:"] + [f"  - {a}" for a in plan.assumptions]
    return "\n".join(lines) + "\n"
