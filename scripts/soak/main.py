"""One soak, end to end: the model, serve, a warm-up of every kind, the timed load with the memory
sampler (and the rank killer), then the verdict. Serve is stopped (SIGTERM, then SIGKILL for
its group and every rank seen) in `finally`, also on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from serve_bench.procs import Proc, stop_procs
from serve_bench.prompts import Prompts
from serve_bench.report import machine, machine_line
from serve_bench.servers import ROOT

from . import replans, verdict
from .killer import Kill, kill_loop
from .kinds import KINDS, Ctx
from .load import Record, client_loop, hostile_loop, run_one
from .sampler import Sample, Sampler
from .serve import Served, SoakError, rank_pids, start, tiny_model, wait_ready


def _terminate(signum: int, _frame: Any) -> None:
    print(f"soak: signal {signum}; stopping serve", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)  # unwinds through the finally that stops serve


def progress(message: str) -> None:
    print(f"soak: {message}", file=sys.stderr, flush=True)


class Soak:
    def __init__(self, args: argparse.Namespace, served: Served, prefix: str, model: str) -> None:
        self.args, self.served, self.prefix, self.model = args, served, prefix, model
        self.records: list[Record] = []
        self.samples: list[Sample] = []
        self.kills: list[Kill] = []
        self.final: Sample | None = None
        self.note = ""

    async def run(self) -> None:
        import anthropic
        import openai

        a, served = self.args, self.served
        oc = openai.AsyncOpenAI(base_url=served.base_url, api_key="none",
                                timeout=a.request_timeout, max_retries=0)  # fmt: skip
        ac = anthropic.AsyncAnthropic(base_url=served.root, api_key="none",
                                      timeout=a.request_timeout, max_retries=0)  # fmt: skip
        ctx = Ctx(oc, ac, self.model, self.prefix, time.monotonic(), stop_at=1e9)
        try:
            await self._warm_up(ctx)
            await self._timed(ctx, oc)
        finally:
            await oc.close()
            await ac.close()

    async def _warm_up(self, ctx: Ctx) -> None:
        """Every kind once, unrecorded: compiles, grammars and the first prefix-cache entry."""
        rng = random.Random(self.args.seed)
        for kind in KINDS:
            r = await run_one(ctx, kind, 0, rng, self.args.request_timeout)
            if not r.ok:
                raise SoakError(f"warm-up {kind} failed: {r.error}")
        progress("warm-up done: every kind answered once")

    async def _timed(self, ctx: Ctx, oc: Any) -> None:
        a = self.args
        duration = a.minutes * 60
        ctx.t0 = t0 = time.monotonic()
        ctx.stop_at = duration
        sampler = Sampler(self.served, t0, a.sample_s)
        sampler.start()
        tasks = [client_loop(ctx, i, a.seed, a.request_timeout, self.records)
                 for i in range(a.clients)]  # fmt: skip
        tasks.append(hostile_loop(ctx, self.served.root, a.hostile_every_s, 60.0, self.records))
        tasks.append(self._watch(ctx, duration))
        if a.kill_every_min:
            tasks.append(kill_loop(self.served, oc, self.model, t0, a.kill_every_min * 60,
                                   duration, a.request_timeout, self.kills))  # fmt: skip
        try:  # the loops end on their own; this bound only catches a bug of ours
            async with asyncio.timeout(duration + a.request_timeout + 400):
                await asyncio.gather(*tasks)
        except TimeoutError:
            self.note = "the load did not wind down in time; cancelled"
        finally:
            sampler.stop()
            self.samples = sampler.samples
            self.final = await asyncio.to_thread(sampler.take)

    async def _watch(self, ctx: Ctx, duration: float) -> None:
        """Progress once a minute; serve gone → stop the load at once (else the clients spin)."""
        next_report = 60.0
        while ctx.now() < ctx.stop_at:
            await asyncio.sleep(1.0)
            if not self.served.proc.running:
                ctx.stop_at = ctx.now()
                self.note = f"serve exited ({self.served.proc.popen.returncode}) during the soak"
            if ctx.now() >= next_report:
                good = [r for r in self.records if not r.hostile]
                failed = sum(not r.ok for r in good)
                progress(f"{ctx.now() / 60:.0f}/{duration / 60:.0f} min: {len(good)} requests, "
                         f"{failed} errors, {len(self.kills)} kills")  # fmt: skip
                next_report += 60.0


def rows_of(soak: Soak, log: str, args: argparse.Namespace) -> list[verdict.Row]:
    w = verdict.Windows.of(args.minutes)
    rows = verdict.requests_rows(soak.records, soak.kills)
    failover = bool(args.kill_every_min)
    if failover:
        failovers = soak.final.metrics.get("failovers_total") if soak.final else None
        rows += replans.kill_rows(soak.records, soak.kills, failovers)
        rows += replans.replan_rows(soak.samples, args.kill_every_min * 60)
        rows.append(replans.launcher_row(soak.samples, soak.kills))
        rows.append(replans.stale_rows(soak.samples))
    else:
        rows += verdict.memory_rows(soak.samples, w)
    rows.append(verdict.itl_row(soak.records, w, criterion=not failover))
    rows.append(verdict.prefix_row(soak.samples))
    rows.append(verdict.traceback_row(log))
    rows.append(verdict.seeded_row(soak.records))
    if soak.note:
        rows.append(verdict.Row("run", soak.note, "", "FAIL"))
    return rows


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    sys.path.insert(0, str(ROOT))
    from tokenizers import Tokenizer

    began = time.monotonic()
    procs: list[Proc] = []
    soak: Soak | None = None
    failure, log = "", ""
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        logs = Path(tmp)
        model = args.model or tiny_model(logs / "model")
        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        prefix, prefix_tokens = Prompts(args.seed).system(tokenizer, args.prefix_tokens)
        marker = uuid.uuid4().hex
        extra = ["--prefix-cache-gb", str(args.prefix_cache_gb), *(args.serve_arg or [])]
        proc = start(model, args.local, logs, marker, extra)
        procs.append(proc)
        try:
            served = wait_ready(proc, marker, args.start_timeout)
            progress(f"serve --local {args.local} ready at {served.base_url}")
            soak = Soak(args, served, prefix, str(model))
            asyncio.run(soak.run())
        except SoakError as e:
            failure = str(e)
        except KeyboardInterrupt:
            failure = "interrupted"
        finally:
            stop_procs(procs)
            left = rank_pids(marker)
            log = proc.err.read_text(errors="replace")
            if args.log:
                args.log.write_text(log)
    rows = rows_of(soak, log, args) if soak else []
    rows.append(verdict.Row("no rank process left once serve stopped", f"{len(left)} left",
                            "0", "PASS" if not left else "FAIL"))  # fmt: skip
    if failure:
        rows.append(verdict.Row("run", failure.splitlines()[0], "", "FAIL"))
    host = machine()
    info = {"machine": host, "seconds": time.monotonic() - began, "prefix_tokens": prefix_tokens}
    mode = f", a rank killed every {args.kill_every_min} min" if args.kill_every_min else ""
    w = verdict.Windows.of(args.minutes)
    print(
        f"\nsoak: serve --local {args.local}, {args.minutes} min, {args.clients} clients{mode}; "
        f"shared prefix {prefix_tokens} tokens; W = {w.first_s:.0f} s, B = {w.base_s:.0f} s"
    )
    print(f"machine: {machine_line(host)}\n")
    print(verdict.to_markdown(rows))
    if failure:
        print(f"\nsoak: {failure}", file=sys.stderr)
    if args.json:
        out = {
            "args": {k: v if isinstance(v, int | float | list | None) else str(v)
                     for k, v in vars(args).items()},
            **info, "verdict": verdict.to_json(rows),
            "kills": [k.to_json() for k in soak.kills] if soak else [],
            "samples": [s.to_json() for s in soak.samples] if soak else [],
            "requests": [r.to_json() for r in soak.records] if soak else [],
        }  # fmt: skip
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if rows and all(r.verdict != "FAIL" for r in rows) else 1
