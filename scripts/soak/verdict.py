"""The verdict: each of the issue's criteria with what was measured and PASS / FAIL (rows marked
"info" are context, not criteria), as a Markdown table and as JSON.

Windows scale with the run: W = min(5 min, run / 4) (the "first 5" and "last 5" minutes) and
B = min(1 min, run / 8) (the memory baseline and final windows). Memory growth compares the
median of a rank's samples in [S, S + B) with the median over the run's last B, where S is W, or
later if the prefix cache was still filling at W (memory grows by design until it is full):
medians, so one sample taken mid-step or right after a cache trim does not decide it."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .killer import Kill
from .load import Record
from .sampler import RankSample, Sample

GROWTH_LIMIT = 0.05
CACHE_BOUND = "prefix_cache_budget_tokens"
CACHE_FULL = 0.9
ITL_RATIO_LIMIT = 1.2
KILL_GRACE_S = 3.0  # after the probe answered: requests that raced it may still see the old error
END_WITHIN_S = 30.0  # a request open at a kill must end (with an error) this soon


@dataclass
class Row:
    criterion: str
    measured: str
    limit: str
    verdict: str  # PASS, FAIL or info


@dataclass
class Windows:
    total_s: float
    first_s: float  # W
    base_s: float  # B

    @classmethod
    def of(cls, minutes: float) -> Windows:
        return cls(minutes * 60, min(5.0, minutes / 4) * 60, min(1.0, minutes / 8) * 60)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.1f} MiB"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _growth_row(label: str, before: float | None, after: float | None) -> Row:
    if not before or after is None:
        return Row(label, f"{_mib(before)} → {_mib(after)}", "≤ +5 %", "FAIL")
    g = after / before - 1
    return Row(label, f"{_mib(before)} → {_mib(after)} ({g:+.1%})", "≤ +5 %",
               _verdict(g <= GROWTH_LIMIT))  # fmt: skip


def in_kill_window(r: Record, kills: list[Kill]) -> bool:
    return any(r.start <= k.window_end + KILL_GRACE_S and r.end >= k.t for k in kills)


def requests_rows(records: list[Record], kills: list[Kill]) -> list[Row]:
    good = [r for r in records if not r.hostile]
    bad = [r for r in good if not r.ok and not (kills and in_kill_window(r, kills))]
    hangs = sum(r.error == "hang" for r in bad)
    excused = sum(not r.ok for r in good) - len(bad)
    rows = [Row("no good request fails", f"{len(bad)} of {len(good)} failed ({hangs} hangs)"
                + (f"; {excused} ended with an error inside kill windows" if kills else ""),
                "0", _verdict(not bad))]  # fmt: skip
    hostile = [r for r in records if r.hostile]
    wrong = [r for r in hostile if not r.ok and not (kills and in_kill_window(r, kills))]
    codes = sorted({r.status for r in hostile if r.status is not None})
    measured = f"{len(hostile)} sent, statuses {codes}, {len(wrong)} wrong"
    rows.append(
        Row(
            "hostile bodies get 4xx, never 5xx",
            measured,
            "all 4xx",
            _verdict(bool(hostile) and not wrong),
        )
    )
    by_kind: dict[str, int] = {}
    for r in good:
        by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
    mix = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
    rows.append(Row("requests sent", mix, "", "info"))
    return rows


def _window(samples: list[Sample], lo: float, hi: float) -> list[Sample]:
    return [s for s in samples if lo <= s.t < hi]


MEASURES: list[tuple[str, Callable[[RankSample], float | None]]] = [
    ("RSS", lambda r: r.rss),
    ("MLX active + cache", lambda r: r.mlx),
]


def cache_full_at(samples: list[Sample]) -> float | None:
    """When the prefix cache first held 90 % of its bound: until then the ranks' memory grows
    by design (each finished sequence is kept), so that is not a leak."""
    for s in samples:
        tokens, bound = s.metrics.get("prefix_cache_tokens"), s.metrics.get(CACHE_BOUND)
        if tokens is not None and bound and tokens >= CACHE_FULL * bound:
            return s.t
    return None


def memory_rows(samples: list[Sample], w: Windows) -> list[Row]:
    """Baseline from max(W, the cache full): in short runs W alone ends before the cache fills;
    in a 30-minute run with serve's bound at its soak default it is W."""
    full = cache_full_at(samples)
    start = w.first_s if full is None or full <= w.first_s else full
    if start + w.base_s > w.total_s - w.base_s:  # filled too late to tell: compare from W
        start = w.first_s
    base = _window(samples, start, start + w.base_s)
    last = _window(samples, w.total_s - w.base_s, w.total_s + 60)
    filled = "never" if full is None else f"at {full:.0f} s"
    rows = [Row("memory baseline from", f"{start:.0f} s (W {w.first_s:.0f} s; prefix cache "
                f"full {filled}), median over {w.base_s:.0f} s vs the last {w.base_s:.0f} s",
                "", "info")]  # fmt: skip
    ranks = sorted({r for s in samples for r in s.ranks})
    for rank in ranks:
        pids = {s.ranks[rank].pid for s in samples if rank in s.ranks}
        if len(pids) > 1:
            rows.append(Row(f"rank {rank} kept its process", f"pids {sorted(pids)}", "one", "FAIL"))
        for name, get in MEASURES:
            before = _med([v for s in base if rank in s.ranks and (v := get(s.ranks[rank]))])
            after = _med([v for s in last if rank in s.ranks and (v := get(s.ranks[rank]))])
            rows.append(_growth_row(f"rank {rank} {name} growth after the baseline", before, after))
    before = _med([s.launcher_rss for s in base if s.launcher_rss is not None])
    after = _med([s.launcher_rss for s in last if s.launcher_rss is not None])
    row = _growth_row("serve process RSS growth after the baseline", before, after)
    rows.append(Row(row.criterion, row.measured, row.limit, "info"))
    return rows


def itl_row(records: list[Record], w: Windows, criterion: bool) -> Row:
    gaps = [(t, g) for r in records if r.ok for t, g in r.gaps]
    first = _pct([g for t, g in gaps if t < w.first_s], 99)
    last = _pct([g for t, g in gaps if t >= w.total_s - w.first_s], 99)
    if not first or not last:
        return Row(
            "ITL p99, last W / first W",
            "no streamed gaps",
            "≤ 1.2×",
            "FAIL" if criterion else "info",
        )
    measured = f"first W {1000 * first:.0f} ms, last W {1000 * last:.0f} ms"
    ratio = last / first
    verdict = _verdict(ratio <= ITL_RATIO_LIMIT) if criterion else "info"
    return Row("ITL p99, last W / first W", f"{measured}: {ratio:.2f}×", "≤ 1.2×", verdict)


def prefix_row(samples: list[Sample]) -> Row:
    seen = [(s.metrics.get("prefix_cache_tokens"), s.metrics.get("prefix_cache_budget_tokens"),
             s.metrics.get("prefix_cache_bytes")) for s in samples]  # fmt: skip
    pairs = [(t, b, by) for t, b, by in seen if t is not None and b is not None]
    if not pairs:
        return Row("prefix cache within its budget", "no /metrics samples", "", "FAIL")
    over = [p for p in pairs if p[0] > p[1]]
    t, b, by = max(pairs, key=lambda p: p[0] / p[1] if p[1] else p[0])
    measured = f"max {t:.0f} of {b:.0f} tokens ({_mib(by)}), {len(over)} samples over"
    return Row("prefix cache within its budget", measured, "tokens ≤ budget", _verdict(not over))


def seeded_row(records: list[Record]) -> Row:
    texts: dict[str, set[str]] = {}
    for r in records:
        if r.ok and r.kind == "seeded_completion":
            seed, _, text = r.text.partition("\n")
            texts.setdefault(seed, set()).add(text)
    same = sum(len(v) == 1 for v in texts.values())
    return Row("seeded requests repeat their text", f"{same} of {len(texts)} seeds", "", "info")


def traceback_row(log: str) -> Row:
    n = log.count("Traceback")
    return Row("no traceback in serve's log", f"{n} found", "0", _verdict(n == 0))


def to_markdown(rows: list[Row]) -> str:
    out = ["| criterion | measured | limit | verdict |", "|---|---|---|---|"]
    out += [f"| {r.criterion} | {r.measured} | {r.limit} | {r.verdict} |" for r in rows]
    return "\n".join(out)


def to_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [vars(r) for r in rows]
