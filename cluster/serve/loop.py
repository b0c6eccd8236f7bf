"""The rank side of `mlx-cluster serve`: continuous batching, every rank in lockstep.

Each round, rank 0's scheduler decides (scheduler.py) and every rank receives the decision in one
collective (control.py), applies it to its batch (engine.py) and runs the agreed number of batch
steps. Identical decisions make identical forward passes, so the collectives inside the model pair
up; only rank 0 reports requests (`begin` / `delta` / `done` / `request_error`, and `stats`).
An idle rank 0 shares a no-op about once a second, so every rank keeps reporting progress and a
dead peer is noticed (the ring backend raises; the launcher's deadlines catch the rest).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, replace
from typing import Any

import mlx.nn as nn
from mlx_lm.generate import generation_stream
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster import heap
from cluster.generate import PROGRESS_EVERY_S, Emit
from cluster.job import RankJob
from cluster.serve import step_times
from cluster.serve.control import Step, share
from cluster.serve.engine import MAX_CHUNK, Engine
from cluster.serve.requests import Limits
from cluster.serve.scheduler import Scheduler
from cluster.speculative.exchange import job_drafts

DEFAULT_MAX_RUNNING = 8
DEFAULT_CACHE_TOKENS = 1 << 16


@dataclass(frozen=True)
class ServeOptions:
    """What the launcher sets for serving (job.options), with the defaults of a bare rank."""

    max_running: int = DEFAULT_MAX_RUNNING  # sequences decoding at once (--max-concurrency)
    prefix_cache_tokens: int = DEFAULT_CACHE_TOKENS  # bound of the prefix cache, in tokens
    token_delay_s: float = 0.0  # a pause after every step, so tests can act mid-request
    prompt_delay_s: float = 0.0  # a pause after every step that reads prompt (a slow prefill)
    speculative: bool = True  # drafts checked in the batch (--speculative)
    # The memory budget in KV positions, the prefix cache's share included (None: count only).
    kv_limit_tokens: int | None = None

    @classmethod
    def from_job(cls, job: RankJob) -> ServeOptions:
        o = job.options
        return cls(
            max_running=max(1, int(o.get("max_running", DEFAULT_MAX_RUNNING))),
            prefix_cache_tokens=max(0, int(o.get("prefix_cache_tokens", DEFAULT_CACHE_TOKENS))),
            token_delay_s=float(o.get("token_delay_s", 0.0)),
            prompt_delay_s=float(o.get("prompt_delay_s", 0.0)),
            speculative=o.get("speculative", "on") != "off",
            kv_limit_tokens=None if o.get("kv_limit_tokens") is None else int(o["kv_limit_tokens"]),
        )


def model_limits(model: nn.Module, tokenizer: TokenizerWrapper) -> Limits:
    """The vocabulary and context the model's config declares (mlx-lm keeps it as `args`)."""
    args = getattr(model, "args", None)
    vocab = int(getattr(args, "vocab_size", 0) or 0) or len(tokenizer.get_vocab())
    context = getattr(args, "max_position_embeddings", None)
    return Limits(vocab, int(context) if context else None)


def serve(
    job: RankJob,
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    group: Any,
    emit: Emit,
    lines: queue.Queue[str],
) -> None:
    """Serve until the launcher closes stdin (the rank's stdin watcher then exits the process)."""
    options = ServeOptions.from_job(job)
    engine = Engine(
        model,
        tokenizer,
        generation_stream,
        options.max_running,
        options.prefix_cache_tokens,
        options.speculative,
        job_drafts(job.options, job.rank, group, generation_stream)
        if options.speculative
        else None,
    )
    scheduler = (
        Scheduler(
            tokenizer,
            emit,
            lines,
            engine.cache,
            options.max_running,
            MAX_CHUNK,
            engine.prefill_rate,
            replace(model_limits(model, tokenizer), kv_tokens=options.kv_limit_tokens),
            engine,
            options.kv_limit_tokens,
        )
        if job.rank == 0
        else None
    )
    ready, last_progress, last_trim = False, 0.0, time.monotonic()
    while True:
        payload = scheduler.decide() if scheduler is not None else None
        step = Step.decode(share(payload, group, generation_stream))
        if step.cache_tokens is not None:  # rank 0 bounded its own (the same object) already
            engine.cache.bound(step.cache_tokens)
        if not ready:
            ready = True  # every rank has joined a collective: all are loaded
            if scheduler is not None:
                emit("ready", world_size=1 if group is None else group.size())
        uids = engine.apply(step)
        if scheduler is not None:
            scheduler.admitted(uids)
            scheduler.flush()
        for _ in range(step.steps):
            started = time.monotonic()
            prompt_responses, responses = engine.next()
            faults = engine.failed()  # on every rank: each forgets its faulted sequences
            took = time.monotonic() - started
            if responses and not prompt_responses:  # decoding steps only, as rank 0's step lines
                step_times.record(took)
                engine.measured(took)
            if scheduler is not None:
                scheduler.observe(prompt_responses, responses, took, faults)
                scheduler.flush()
            if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                stage = "prompt" if prompt_responses else "decode"
                emit("progress", stage=stage, tokens=len(responses), batch=len(engine.active))
                last_progress = time.monotonic()
            if options.token_delay_s:
                time.sleep(options.token_delay_s)
            if options.prompt_delay_s and prompt_responses:
                time.sleep(options.prompt_delay_s)
            if scheduler is not None:
                scheduler.stepped(
                    time.monotonic() - started, bool(responses and not prompt_responses)
                )
            if engine.idle:  # every rank sees the same batch empty out at the same step
                break
        if scheduler is not None:
            scheduler.stats(batch=len(engine.active))
            scheduler.flush()
        if time.monotonic() - last_trim >= heap.TRIM_EVERY_S:  # cluster/heap.py: RSS follows MLX
            heap.give_back()
            last_trim = time.monotonic()
        if not step.steps and time.monotonic() - last_progress >= PROGRESS_EVERY_S:
            emit("progress", stage="decode", tokens=0, idle=True)
            last_progress = time.monotonic()
