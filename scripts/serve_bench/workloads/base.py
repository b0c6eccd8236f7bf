"""What a workload is: one kind of work, run in every repetition against each of its servers.

The runner asks a workload for one repetition's steps once (the same prompts for every server:
each has its own caches, so neither sees a prompt twice), then runs each step against each
server (interleaved, or one server at a time), and at the end asks for its summary, its rows of
the main table (ours, mlx-lm, ratio) and any table of its own printed after that one.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ..prompts import Prompts
from ..servers import Server
from ..stats import Results

Step = TypeVar("Step")


@dataclass(frozen=True)
class Target:
    """One server under test as a step sees it: its client, the run's options and where the
    figures go."""

    server: Server
    client: Any  # openai.AsyncOpenAI
    args: argparse.Namespace
    results: Results


class Workload(ABC, Generic[Step]):
    name: str
    servers: tuple[str, ...]  # the servers it runs against (of servers.NAMES)
    section: ClassVar[str]  # the summary's key its figures go under

    @abstractmethod
    def prepare(self, prompts: Prompts, tokenizer: Any, args: argparse.Namespace) -> list[Step]:
        """One repetition's steps, in order."""

    @abstractmethod
    async def run(self, target: Target, rep: int, index: int, step: Step) -> None:
        """Run step number `index` against one server; keep its figures in target.results."""

    @abstractmethod
    def summarize(self, results: Results, args: argparse.Namespace) -> dict[str, Any]:
        """Its part of the summary's `section` (medians over repetitions)."""

    def rows(self, summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
        """Its rows of the main table (metric | mlx-cluster | mlx-lm | ours / mlx-lm)."""
        return []

    def tables(self, summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
        """Lines of its own printed after the main table."""
        return []
