"""What a bench run measured, from rank 0's raw token times, and how it is shown.

Per trial: TTFT = time to the first token (prefill of the P prompt tokens + one step), prompt
tok/s = P / TTFT, generation tok/s = (G - 1) / (last token - first token), inter-token latencies
= the gaps between tokens. Over trials: the median of each rate; ITL percentiles over every gap
of every trial. Speedup and efficiency are against the 1-host run of the same bench.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from topology.model.spec import ModelSpec

if TYPE_CHECKING:
    from launcher.bench.runs import BenchSettings

# The JSON contract of each result; more fields follow these.
FIELDS = (
    "hosts", "strategy", "backend", "prompt_tps", "generation_tps", "ttft_s", "itl_p50_ms",
    "itl_p99_ms", "peak_memory_bytes", "speedup", "efficiency", "bandwidth_gbps",
    "predicted_decode_tok_s",
)  # fmt: skip
DRAFT_FIELDS = ("drafted_tokens", "accepted_tokens", "draft_checks")


@dataclass(frozen=True)
class Measured:
    prompt_tps: float
    generation_tps: float
    ttft_s: float
    itl_p50_ms: float
    itl_p99_ms: float
    peak_memory_bytes: tuple[int, ...]  # per rank
    trials: int
    # Over the trials, with --speculative on (0 otherwise): drafted tokens, the accepted ones,
    # and the forwards that checked drafts.
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_checks: int = 0


@dataclass(frozen=True)
class Row:
    hosts: int
    strategy: str
    backend: str
    measured: Measured
    bandwidth_gbps: float
    predicted_decode_tok_s: float | None
    predicted_calibrated_tok_s: float | None = None
    predicted_ttft_s: float | None = None  # None: a host's compute was not measured
    speedup: float | None = None
    efficiency: float | None = None

    def to_json(self) -> dict[str, Any]:
        m = asdict(self.measured)
        m["peak_memory_bytes"] = list(self.measured.peak_memory_bytes)
        out: dict[str, Any] = {
            "hosts": self.hosts, "strategy": self.strategy, "backend": self.backend, **m,
            "speedup": self.speedup, "efficiency": self.efficiency,
            "bandwidth_gbps": self.bandwidth_gbps,
            "predicted_decode_tok_s": self.predicted_decode_tok_s,
            "prediction_error": error(self.predicted_decode_tok_s, self.measured.generation_tps),
            "predicted_calibrated_tok_s": self.predicted_calibrated_tok_s,
            "prediction_error_calibrated": error(
                self.predicted_calibrated_tok_s, self.measured.generation_tps
            ),
            "predicted_ttft_s": self.predicted_ttft_s,
            "ttft_error": error(self.predicted_ttft_s, self.measured.ttft_s),
        }  # fmt: skip
        return {k: out[k] for k in (*FIELDS, *(k for k in out if k not in FIELDS))}


@dataclass(frozen=True)
class Skipped:
    hosts: int
    strategy: str
    reason: str


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def measure(result: dict[str, Any]) -> Measured:
    """Rates and latencies from rank 0's bench "result" event (ValueError if malformed)."""
    prompt_tokens = int(result["prompt_tokens"])
    trials = [list(map(float, t["token_times_s"])) for t in result["trials"]]
    if not trials or any(len(t) < 2 for t in trials):
        raise ValueError("a bench result needs at least one trial of two or more tokens")
    ttft = [t[0] for t in trials]
    generation = [(len(t) - 1) / max(t[-1] - t[0], 1e-9) for t in trials]
    gaps = [b - a for t in trials for a, b in itertools.pairwise(t)]
    return Measured(
        prompt_tps=round(statistics.median(prompt_tokens / max(s, 1e-9) for s in ttft), 2),
        generation_tps=round(statistics.median(generation), 2),
        ttft_s=round(statistics.median(ttft), 6),
        itl_p50_ms=round(percentile(gaps, 50) * 1e3, 4),
        itl_p99_ms=round(percentile(gaps, 99) * 1e3, 4),
        peak_memory_bytes=tuple(int(b) for b in result["peak_memory_bytes"]),
        trials=len(trials),
        **{k: sum(int(t.get(k, 0)) for t in result["trials"]) for k in DRAFT_FIELDS},
    )


def bytes_per_token(spec: ModelSpec, prompt_tokens: int, gen_tokens: int) -> float:
    """Weights read per decoded token (active experts only) + the KV cache at the mean context."""
    context = prompt_tokens + gen_tokens / 2
    return spec.active_bytes_per_token + spec.kv_bytes_per_token * context


def error(predicted: float | None, measured: float) -> float | None:
    """(predicted - measured) / measured, e.g. 0.25 = predicted 25 % too fast."""
    if predicted is None or measured <= 0:
        return None
    return round((predicted - measured) / measured, 4)


def with_speedups(rows: Sequence[Row]) -> list[Row]:
    """Speedup = generation tok/s / the 1-host run's; efficiency = speedup / hosts."""
    base = next((r.measured.generation_tps for r in rows if r.hosts == 1), None)
    out = []
    for r in rows:
        if base is None or base <= 0:
            out.append(r)
            continue
        speedup = r.measured.generation_tps / base
        out.append(replace(r, speedup=round(speedup, 6), efficiency=round(speedup / r.hosts, 6)))
    return out


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:+.0f}%"


def _memory(peaks: Sequence[int]) -> str:
    top = max(peaks) if peaks else 0
    return f"{top / 1e9:.2f} GB" if top >= 1e9 else f"{top / 1e6:.1f} MB"


def markdown_table(rows: Sequence[Row], skipped: Sequence[Skipped]) -> str:
    """The results as a markdown table, then one line per skipped size/strategy."""
    calibrated = any(r.predicted_calibrated_tok_s is not None for r in rows)
    head = [
        "hosts", "strategy", "backend", "prompt tok/s", "gen tok/s", "TTFT s", "ITL p50 ms",
        "ITL p99 ms", "peak mem/rank", "speedup", "efficiency", "GB/s", "predicted", "error",
        "predicted TTFT s", "TTFT error",
    ]  # fmt: skip
    if calibrated:
        head += ["calibrated", "error"]
    drafted = any(r.measured.draft_checks for r in rows)
    if drafted:
        head += ["accepted", "tokens/check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r.measured
        cells = [
            str(r.hosts), r.strategy, r.backend, f"{m.prompt_tps:.1f}", f"{m.generation_tps:.1f}",
            f"{m.ttft_s:.3f}", f"{m.itl_p50_ms:.2f}", f"{m.itl_p99_ms:.2f}",
            _memory(m.peak_memory_bytes), _num(r.speedup, ".2f"), _num(r.efficiency, ".0%"),
            f"{r.bandwidth_gbps:.2f}", _num(r.predicted_decode_tok_s, ".1f"),
            _pct(error(r.predicted_decode_tok_s, m.generation_tps)),
            _num(r.predicted_ttft_s, ".3f"), _pct(error(r.predicted_ttft_s, m.ttft_s)),
        ]  # fmt: skip
        if calibrated:
            predicted = r.predicted_calibrated_tok_s
            cells += [_num(predicted, ".1f"), _pct(error(predicted, m.generation_tps))]
        if drafted:
            cells += [f"{m.accepted_tokens}/{m.drafted_tokens}", _per_check(m)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [f"skipped: {s.strategy} × {s.hosts}: {s.reason}" for s in skipped]
    return "\n".join(lines)


def _per_check(m: Measured) -> str:
    """Tokens a checking forward gave: its accepted drafts and the one it draws itself."""
    if not m.draft_checks:
        return "–"
    return f"{(m.accepted_tokens + m.draft_checks) / m.draft_checks:.2f}"


def run_summary(row: Row, seconds: float) -> str:
    """The end of a run's progress line (its start, `bench [i/n] ...:`, is shown as it begins)."""
    m = row.measured
    predicted = _num(row.predicted_decode_tok_s, ".1f")
    drafts = (
        f", {m.accepted_tokens}/{m.drafted_tokens} drafted tokens accepted, "
        f"{_per_check(m)} tokens per checking step"
        if m.draft_checks
        else ""
    )
    return (
        f"generation {m.generation_tps:.1f} tok/s, prompt {m.prompt_tps:.1f} tok/s, "
        f"TTFT {m.ttft_s:.3f} s (predicted {_num(row.predicted_ttft_s, '.3f')} s), "
        f"predicted {predicted} tok/s{drafts} [{seconds:.1f} s]"
    )


def bench_document(
    machine: dict[str, Any],
    model: str,
    settings: BenchSettings,
    rows: Sequence[Row],
    skipped: Sequence[Skipped],
    calibration: dict[str, Any] | None,
) -> dict[str, Any]:
    """What --json FILE holds: the machine, the settings, one result per size × strategy."""
    return {
        "machine": machine,
        "model": model,
        "settings": asdict(settings),
        "results": [r.to_json() for r in rows],
        "skipped": [asdict(s) for s in skipped],
        "calibration": calibration,
    }
