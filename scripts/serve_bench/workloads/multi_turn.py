"""Multi-turn: a system message of >= --prefix-tokens tokens and a question (turn 1: a cache
miss), then all of it again with the answer and a second question (turn 2: a server that keeps
the prefix answers sooner); --conversations of them per repetition, one client."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, ClassVar

from ..client import run_round
from ..prompts import Prompts, user
from ..servers import NAMES
from ..stats import Results, median
from ..text import fmt, progress, ratio_row
from .base import Target, Workload


@dataclass(frozen=True)
class Conversation:
    system: str
    system_tokens: int
    first: str
    second: str


@dataclass(frozen=True)
class MultiTurn(Workload[Conversation]):
    name: str = "multi-turn"
    servers: tuple[str, ...] = NAMES
    section: ClassVar[str] = "multi_turn"

    def prepare(
        self, prompts: Prompts, tokenizer: Any, args: argparse.Namespace
    ) -> list[Conversation]:
        conversations = []
        for _ in range(args.conversations):
            system, count = prompts.system(tokenizer, args.prefix_tokens)
            conversations.append(
                Conversation(system, count, prompts.question(), prompts.question())
            )
        return conversations

    async def run(self, target: Target, rep: int, index: int, step: Conversation) -> None:
        """Turn 1: system + question (a cache miss); turn 2: all of it again with the answer and
        a second question (a server that keeps the prefix answers it sooner)."""
        server, client, args = target.server, target.client, target.args
        first = [{"role": "system", "content": step.system}, user(step.first)]
        one = await run_round(
            client, server, [[first]], args.max_tokens, {}, args.round_timeout, kind="turn-1"
        )
        answer = one.requests[0]
        progress(
            f"rep {rep + 1} multi-turn {index + 1} {server.name:<11} system "
            f"{step.system_tokens} tokens: TTFT turn 1 {fmt(answer.ttft_s, 1000)} ms"
        )
        second = [*first, {"role": "assistant", "content": answer.text}, user(step.second)]
        two = await run_round(
            client, server, [[second]], args.max_tokens, {}, args.round_timeout, kind="turn-2"
        )
        turn: dict[str, Any] = {
            "server": server.name, "rep": rep, "conversation": index,
            "system_tokens": step.system_tokens,
            "ttft_1": answer.ttft_s, "ttft_2": two.requests[0].ttft_s,
            "tokens_1": answer.tokens, "tokens_2": two.requests[0].tokens,
            "rejected": answer.rejected or two.requests[0].rejected,
        }  # fmt: skip
        target.results.turns.append(turn)
        progress(f"{'':>28} turn 2 {fmt(turn['ttft_2'], 1000)} ms")

    def summarize(self, results: Results, args: argparse.Namespace) -> dict[str, Any]:
        """Per server: the median over repetitions of each repetition's median TTFT per turn."""
        out: dict[str, Any] = {}
        for name in self.servers:
            mine = [t for t in results.turns if t["server"] == name]
            per_rep: dict[str, list[float | None]] = {"ttft_1": [], "ttft_2": []}
            for rep in range(args.reps):
                in_rep = [t for t in mine if t["rep"] == rep]
                for m in per_rep:
                    per_rep[m].append(median([t[m] for t in in_rep]))
            out[name] = {m: median(v) for m, v in per_rep.items()}
        return out

    def rows(self, summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
        turns = summary["multi_turn"]
        return [
            ratio_row(
                f"{text}, {args.prefix_tokens}+ token prefix",
                turns["mlx-cluster"][metric],
                turns["mlx-lm"][metric],
                1000.0,
                ".1f",
            )
            for metric, text in (
                ("ttft_1", "first-turn TTFT (ms)"),
                ("ttft_2", "second-turn TTFT (ms)"),
            )
        ]


MULTI_TURN = MultiTurn()
