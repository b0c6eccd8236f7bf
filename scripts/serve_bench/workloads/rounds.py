"""Rounds: c clients at once, each sending --per-client fresh questions one after the other, for
every level c of --concurrency; RoundKind says which servers, which levels and what goes into
each request. PLAIN, a plain streamed chat against both servers, is the main table's body."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..client import run_round
from ..prompts import Message, Prompts, user
from ..servers import NAMES
from ..stats import Results, median_rounds
from ..text import fmt, progress, ratio_row
from .base import Target, Workload

Clients = list[list[list[Message]]]  # per client, the message lists it sends one after the other

# (summary key, table label, scale, format) of each round figure in the tables
METRICS = (
    ("tok_s", "aggregate tok/s, {c} client{s}", 1.0, ".1f"),
    ("ttft_p50", "TTFT p50 (ms), {c} client{s}", 1000.0, ".1f"),
    ("ttft_p99", "TTFT p99 (ms), {c} client{s}", 1000.0, ".1f"),
    ("itl_p50", "ITL p50 (ms), {c} client{s}", 1000.0, ".1f"),
    ("itl_p99", "ITL p99 (ms), {c} client{s}", 1000.0, ".1f"),
    ("tpot_p50", "time per output token p50 (ms), {c} client{s}", 1000.0, ".1f"),
    ("mean_tokens", "mean completion tokens, {c} client{s}", 1.0, ".1f"),
)


def clients_label(text: str, c: int) -> str:
    return text.format(c=c, s="" if c == 1 else "s")


@dataclass(frozen=True)
class RoundKind(Workload[Clients]):
    """A kind of round; its `request_kwargs` go into every request (see client.run_round)."""

    name: str
    request_kwargs: dict[str, Any] = field(default_factory=dict)
    servers: tuple[str, ...] = NAMES
    concurrency: tuple[int, ...] | None = None  # None: every --concurrency
    section: ClassVar[str] = "rounds"

    def levels(self, args: argparse.Namespace) -> list[int]:
        return [c for c in args.concurrency if self.concurrency is None or c in self.concurrency]

    def prepare(self, prompts: Prompts, tokenizer: Any, args: argparse.Namespace) -> list[Clients]:
        return [
            [[[user(prompts.question())] for _ in range(args.per_client)] for _ in range(c)]
            for c in self.levels(args)
        ]

    async def run(self, target: Target, rep: int, index: int, step: Clients) -> None:
        args, server = target.args, target.server
        result = await run_round(
            target.client, server, step, args.max_tokens, self.request_kwargs,
            args.round_timeout, kind=self.name, rep=rep,
        )  # fmt: skip
        target.results.rounds.append(result)
        s = result.summary()
        progress(
            f"rep {rep + 1} {self.name} c={len(step):<2} {server.name:<11} "
            f"{fmt(s['tok_s'], 1, 7)} tok/s  TTFT p50 {fmt(s['ttft_p50'], 1000)} ms  ITL p50 "
            f"{fmt(s['itl_p50'], 1000)} ms  {fmt(s['mean_tokens'])} tokens/req"
            + (f"  {s['retries']} retries" if s["retries"] else "")
            + (f"  {s['rejected']} REJECTED (429)" if s["rejected"] else "")
        )

    def summarize(self, results: Results, args: argparse.Namespace) -> dict[str, Any]:
        """Per concurrency "kind/cC", per server: the medians over repetitions."""
        mine = [r for r in results.rounds if r.kind == self.name]
        return {
            f"{self.name}/c{c}": {
                name: median_rounds([r for r in mine if r.server == name and r.concurrency == c])
                for name in self.servers
            }
            for c in self.levels(args)
        }

    def rows(self, summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
        """Ours next to mlx-lm, each metric at each level; none for a kind only one runs."""
        if not all(name in self.servers for name in NAMES):
            return []
        lines = []
        for metric, text, scale, spec in METRICS:
            for c in self.levels(args):
                ours, theirs = (summary["rounds"][f"{self.name}/c{c}"][n][metric] for n in NAMES)
                label = clients_label(text, c)
                label = label if self.name == "plain" else f"{label} ({self.name})"
                lines.append(ratio_row(label, ours, theirs, scale, spec))
        return lines


PLAIN = RoundKind("plain")
