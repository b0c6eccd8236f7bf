"""What is measured: per request (TTFT, ITL, TPOT, completion tokens), per round (aggregate
tok/s and percentiles over its requests), and everything a run keeps (Results)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


@dataclass
class RequestResult:
    client: int
    start_s: float  # since the round's start
    end_s: float
    ttft_s: float | None  # None: no content chunk at all
    itl_s: list[float]  # gaps between consecutive content chunks
    content_chunks: int
    usage_tokens: int | None  # completion_tokens of the usage chunk, if the server sent one
    finish_reason: str | None
    text: str
    rejected: bool = False  # still 429 after the client's retries

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.content_chunks

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: a server holds back the tokens that end in the
        middle of a UTF-8 character (random weights make many), so a chunk may carry several."""
        return sum(self.itl_s) / (self.tokens - 1) if self.tokens > 1 and self.itl_s else None


@dataclass
class RoundResult:
    server: str
    kind: str
    concurrency: int
    rep: int
    wall_s: float
    retries: dict[str, int]  # the client's retries by cause: "HTTP 429", "ConnectError"...
    requests: list[RequestResult]

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.requests if not r.rejected]
        tokens = sum(r.tokens for r in done)
        ttft = [r.ttft_s for r in done if r.ttft_s is not None]
        itl = [gap for r in done for gap in r.itl_s]
        return {
            "tok_s": tokens / self.wall_s if self.wall_s > 0 else None,
            "ttft_p50": percentile(ttft, 50),
            "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(itl, 50),
            "itl_p99": percentile(itl, 99),
            "tpot_p50": percentile([t for r in done if (t := r.tpot_s) is not None], 50),
            "mean_tokens": tokens / len(done) if done else None,
            "completion_tokens": tokens,
            "token_source": "usage" if all(r.usage_tokens is not None for r in done) else "chunks",
            "requests": len(self.requests),
            "rejected": len(self.requests) - len(done),
            "retries": sum(self.retries.values()),
            "retry_causes": self.retries,
            "wall_s": self.wall_s,
        }


SUMMARIZED = ("tok_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50", "mean_tokens")


def median_rounds(rounds: list[RoundResult]) -> dict[str, Any]:
    """Medians over repetitions of these rounds' figures (one kind, concurrency and server);
    rejections and retries summed."""
    sums = [r.summary() for r in rounds]
    med: dict[str, Any] = {m: median([s[m] for s in sums]) for m in SUMMARIZED}
    med["rejected"] = sum(s["rejected"] for s in sums)
    med["retries"] = sum(s["retries"] for s in sums)
    causes: dict[str, int] = {}
    for s in sums:
        for cause, n in s["retry_causes"].items():
            causes[cause] = causes.get(cause, 0) + n
    med["retry_causes"] = causes
    med["token_source"] = sorted({s["token_source"] for s in sums})
    return med


@dataclass
class Results:
    """Everything a run measured: the rounds, the multi-turn turns (one dict a conversation and
    server), each server's idle CPU share and its start-to-ready times."""

    rounds: list[RoundResult] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    idle_cpu: dict[str, float | None] = field(default_factory=dict)
    ready_s: dict[str, list[float]] = field(default_factory=dict)
