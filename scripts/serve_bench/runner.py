"""The schedule: Bench starts, warms up and stops the servers and runs every workload's steps
against them, interleaved (both up all run, the order alternating each repetition) or one
server at a time (--one-at-a-time); it keeps every figure in a Results."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from .client import count_retries, open_client, run_round
from .procs import Proc, cpu_seconds, stop_procs
from .prompts import Prompts, user
from .servers import NAMES, Server, start_server
from .stats import Results
from .text import progress
from .workloads import WORKLOADS, Target, Workload


def ordered(names: tuple[str, ...], rep: int) -> tuple[str, ...]:
    return names if rep % 2 == 0 else names[::-1]


def idle_cpu(servers: tuple[Server, ...], seconds: float) -> dict[str, float | None]:
    """Share of a core each server's processes use while nobody asks them anything: with both
    up for the whole run, an idle server that spins slows the other one down."""
    pids = {s.name: s.pids() for s in servers}
    before = {name: cpu_seconds(p) for name, p in pids.items()}
    time.sleep(seconds)
    after = {name: cpu_seconds(p) for name, p in pids.items()}
    out: dict[str, float | None] = {}
    for name in pids:
        b, a = before[name], after[name]
        out[name] = None if a is None or b is None else (a - b) / seconds
    return out


class Bench:
    """Starts, warms up and stops the servers; runs the schedule; keeps every result."""

    def __init__(
        self,
        args: argparse.Namespace,
        model: Path,
        logs: Path,
        procs: list[Proc],
        tokenizer: Any,
        workloads: tuple[Workload[Any], ...] = WORKLOADS,
    ) -> None:
        self.args, self.model, self.logs, self.procs = args, model, logs, procs
        self.tokenizer, self.workloads = tokenizer, workloads
        self.prompts = Prompts(args.seed)
        self.servers: dict[str, Server] = {}
        self.clients: dict[str, Any] = {}
        self.results = Results(ready_s={name: [] for name in NAMES})

    async def run(self) -> None:
        count_retries()
        try:
            if not self.args.one_at_a_time:
                await self.up(NAMES)
            for rep in range(self.args.reps):
                # One repetition's fresh prompts, the same for both servers (the same work; each
                # server has its own caches, so neither sees a prompt twice).
                todo = [w.prepare(self.prompts, self.tokenizer, self.args) for w in self.workloads]
                order = ordered(NAMES, rep)
                if self.args.one_at_a_time:
                    for name in order:
                        await self.up((name,))
                        for workload, steps in zip(self.workloads, todo, strict=True):
                            if name in workload.servers:
                                for i, step in enumerate(steps):
                                    await workload.run(self.target(name), rep, i, step)
                        await self.down(name)
                    continue
                for workload, steps in zip(self.workloads, todo, strict=True):
                    for i, step in enumerate(steps):
                        for name in order:
                            if name in workload.servers:
                                await workload.run(self.target(name), rep, i, step)
        finally:
            for client in self.clients.values():
                await client.close()

    def target(self, name: str) -> Target:
        return Target(self.servers[name], self.clients[name], self.args, self.results)

    async def up(self, names: tuple[str, ...]) -> None:
        """Start these servers (loading side by side), wait until ready, warm them up, and the
        first time, measure how much CPU they burn while idle."""
        args = self.args
        began = time.monotonic()
        same_blas, own_cores = args.their_blas == "same", args.their_cores == "own"
        waiting = {name: start_server(name, args.cli, self.model, self.logs, self.procs, same_blas,
                                      own_cores)
                   for name in names}  # fmt: skip
        for name in names:
            server = self.servers[name] = waiting[name](args.start_timeout)
            self.clients[name] = open_client(server, args.request_timeout, args.max_retries)
        for name in names:
            # Not recorded: mlx-lm loads its weights here; both compile their batched paths.
            for c in (1, 4):
                convs = [[[user(self.prompts.question())]] for _ in range(c)]
                await run_round(
                    self.clients[name], self.servers[name], convs, 8, {},
                    args.start_timeout, kind="warm-up",
                )  # fmt: skip
            took = time.monotonic() - began
            self.results.ready_s[name].append(took)
            progress(f"{name} ready at {self.servers[name].base_url} ({took:.1f} s incl. warm-up)")
        idle = self.results.idle_cpu
        fresh = tuple(self.servers[n] for n in names if n not in idle)
        if fresh:
            idle |= await asyncio.to_thread(idle_cpu, fresh, args.idle_probe)
            for server in fresh:
                if (share := idle[server.name]) is not None:
                    progress(f"{server.name} idle: its processes use {100 * share:.0f}% of a core")

    async def down(self, name: str) -> None:
        await self.clients.pop(name).close()
        server = self.servers.pop(name)
        stop_procs(server.procs)
        for p in server.procs:
            self.procs.remove(p)
