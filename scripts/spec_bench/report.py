"""Figures per group, server and workload, the ratios the goals name (median of the repetitions'
ratios, with their spread), and whether every text equals --speculative off's."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from .measure import Result

Key = tuple[str, str, str]  # group, server, workload


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


class Figures:
    def __init__(self) -> None:
        self.rounds: dict[Key, list[tuple[int, float, list[Result]]]] = defaultdict(list)  # add()

    def add(self, key: Key, rep: int, wall: float, results: list[Result]) -> None:
        self.rounds[key].append((rep, wall, results))

    def tps(self, key: Key, rep: int | None = None) -> float:
        """Generated tokens per second of wall time, over the rounds (of one repetition)."""
        rounds = [r for r in self.rounds.get(key, []) if rep is None or r[0] == rep]
        tokens = sum(x.tokens for _, _, rs in rounds for x in rs)
        wall = sum(w for _, w, _ in rounds)
        return tokens / wall if wall else float("nan")

    def summary(self, key: Key) -> dict[str, Any]:
        results = [x for _, _, rs in self.rounds.get(key, []) for x in rs]
        gaps = [g for x in results for g in x.gaps]
        checks = sum(x.checks for x in results)
        return {
            "tok_s": self.tps(key),
            "ttft_p50_s": statistics.median(x.ttft for x in results),
            "itl_p50_ms": 1000 * _pct(gaps, 0.5),
            "itl_p99_ms": 1000 * _pct(gaps, 0.99),
            "tokens": sum(x.tokens for x in results),
            "tokens_per_check": (sum(x.accepted for x in results) + checks) / checks
            if checks
            else None,
            "accepted": sum(x.accepted for x in results),
            "drafted": sum(x.drafted for x in results),
        }

    def ratio(self, group: str, a: str, b: str, workload: str) -> dict[str, float] | None:
        """a's tok/s over b's, per repetition: median, min, max."""
        ka, kb = (group, a, workload), (group, b, workload)
        if not self.rounds.get(ka) or not self.rounds.get(kb):
            return None
        reps = sorted({r for r, _, _ in self.rounds[ka]})
        values = [self.tps(ka, r) / self.tps(kb, r) for r in reps]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    def identical(self, group: str, workload: str, other: str = "ours-off") -> bool | None:
        """Every text of ours equals `other`'s for the same prompt and repetition."""
        ours = self.rounds.get((group, "ours", workload), [])
        theirs = self.rounds.get((group, other, workload), [])
        if not ours or not theirs:
            return None
        return [x.text for _, _, rs in ours for x in rs] == [
            x.text for _, _, rs in theirs for x in rs
        ]


def table(figures: Figures, groups: dict[str, list[Any]], workloads: list[str]) -> list[str]:
    lines = [
        "| group | workload | server | tok/s | TTFT p50 | ITL p50 / p99 | tokens per check "
        "| vs ours-off | vs mlx-lm | same text as off |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for group, specs in groups.items():
        labels = [s.label for s in specs]
        for w in workloads:
            for label in labels:
                key = (group, label, w)
                if not figures.rounds.get(key):
                    continue
                s = figures.summary(key)
                per_check = "" if s["tokens_per_check"] is None else f"{s['tokens_per_check']:.2f}"
                cells = [_ratio(figures.ratio(group, label, o, w)) if label == "ours" else ""
                         for o in ("ours-off", "mlx-lm")]  # fmt: skip
                same = figures.identical(group, w) if label == "ours" else None
                same_text = "" if same is None else "yes" if same else "NO"
                lines.append(
                    f"| {group} | {w} | {label} | {s['tok_s']:.1f} | {s['ttft_p50_s']:.2f} s "
                    f"| {s['itl_p50_ms']:.0f} / {s['itl_p99_ms']:.0f} ms | {per_check} "
                    f"| {cells[0]} | {cells[1]} | {same_text} |"
                )
    return lines


def _ratio(r: dict[str, float] | None) -> str:
    if r is None:
        return ""
    return f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})"
