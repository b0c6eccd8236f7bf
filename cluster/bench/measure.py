"""Rank side of `mlx-cluster bench`: job.mode "bench" (timed decoding) and "calibrate".

bench: load the shard as for generate, then run `warmup` untimed and `trials` timed decodes of a
synthetic prompt of exactly `prompt_tokens` ids (the same seeded ids on every rank, so no
tokenizer or broadcast is involved) and exactly `gen_tokens` greedy tokens: mlx-lm's
generate_step is used directly because it never stops at EOS. Rank 0 timestamps every token;
its "result" event carries the raw times and every rank's peak memory, and the launcher
computes the rates (launcher/bench/report.py). calibrate: see cluster/bench/calibrate.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Protocol

from cluster.job import RankJob
from topology.errors import InputError

PROGRESS_EVERY_S = 0.5


class Reporter(Protocol):
    """What cluster.rank's Reporter offers (event lines on stderr)."""

    def emit(self, event: str, **data: Any) -> None: ...

    def enter(self, stage: str, **data: Any) -> None: ...


def run_measurement(job: RankJob, reporter: Reporter) -> None:
    """Entry point from cluster.rank for modes "bench" and "calibrate"; raises on failure."""
    from cluster.distributed import init_group, job_environment

    reporter.enter("init", backend=job.backend, world_size=job.world_size)
    with job_environment(job):
        group = init_group(job)
    if job.mode == "calibrate":
        from cluster.bench.calibrate import calibrate

        calibrate(job, group, reporter.emit)
    elif job.mode == "bench":
        _bench(job, group, reporter)
    else:
        raise InputError(f"mode {job.mode!r} is not a measurement mode (bench, calibrate)")
    reporter.enter("done")


def _option(job: RankJob, name: str, default: int | None = None, least: int = 1) -> int:
    value = job.options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(f"bench job option {name} must be an integer >= {least}, got {value!r}")
    return value


def _bench(job: RankJob, group: Any, reporter: Reporter) -> None:
    prompt_tokens = _option(job, "prompt_tokens")
    gen_tokens = _option(job, "gen_tokens", least=2)
    trials = _option(job, "trials", 1)
    warmup = _option(job, "warmup", 1, least=0)
    # mlx-lm is imported only now: MLX had to see the job's environment first.
    import mlx.core as mx
    from mlx_lm.generate import generation_stream, wired_limit

    from cluster.generate import barrier, gather_peak_memory
    from cluster.load import shard_for_job
    from cluster.speculative.exchange import job_drafts

    reporter.enter("load", model=job.model, strategy=job.strategy)
    started = time.monotonic()
    shard = shard_for_job(job, group, reporter.emit)
    load_s = round(time.monotonic() - started, 3)
    reporter.enter("decode", layers=list(shard.layers), files=len(shard.files), load_s=load_s,
                   copied=asdict(shard.fetched))  # fmt: skip
    vocab = int(shard.config["vocab_size"])
    ids = mx.random.randint(0, vocab, (prompt_tokens,), key=mx.random.key(job.seed))
    ids = ids.astype(mx.int32)
    drafting = job.options.get("speculative", "off") == "on"
    if drafting:  # a block said twice: what follows can be copied, as agents' answers copy
        half = prompt_tokens // 2
        ids = mx.concatenate([ids[: prompt_tokens - half], ids[:half]])
    mx.eval(ids)
    mx.reset_peak_memory()  # the peak of inference: weights + KV cache + activations
    timed: list[dict[str, Any]] = []
    with wired_limit(shard.model, [generation_stream]):  # type: ignore[list-item]
        for trial in range(warmup + trials):
            if drafting:
                drafts = job_drafts(job.options, job.rank, group, generation_stream)
                run = _timed_drafted_decode(shard.model, ids, gen_tokens, drafts, reporter.emit)
            else:
                run = {"token_times_s": _timed_decode(shard.model, ids, gen_tokens, reporter.emit)}
            # generate_step runs one step ahead: let its collectives finish before any other.
            mx.synchronize(generation_stream)
            if trial >= warmup:
                timed.append(run)
    peaks = gather_peak_memory(int(mx.get_peak_memory()), group)
    if job.rank == 0:
        reporter.emit(
            "result",
            prompt_tokens=prompt_tokens,
            generation_tokens=gen_tokens,
            trials=timed,
            peak_memory_bytes=peaks,
            load_s=load_s,
        )
    barrier(group)


def _timed_decode(model: Any, ids: Any, gen_tokens: int, emit: Any) -> list[float]:
    """Seconds from the start to each of exactly gen_tokens greedy tokens (EOS ignored)."""
    from mlx_lm.generate import generate_step

    times: list[float] = []
    last_event = 0.0
    emit("progress", stage="prompt", done=0, total=int(ids.size))
    start = time.perf_counter()
    for _token, _logprobs in generate_step(ids, model, max_tokens=gen_tokens):
        now = time.perf_counter()
        times.append(round(now - start, 6))
        if now - last_event >= PROGRESS_EVERY_S:  # every rank: the launcher's progress clock
            emit("progress", stage="decode", tokens=len(times))
            last_event = now
    if len(times) != gen_tokens:
        raise RuntimeError(f"decoded {len(times)} tokens, expected {gen_tokens}")
    emit("progress", stage="decode", tokens=len(times))
    return times


def _timed_drafted_decode(
    model: Any, ids: Any, gen_tokens: int, with_model: Any, emit: Any
) -> dict[str, Any]:
    """As _timed_decode with drafts checked in the forward (bench --speculative on): prompt
    lookup's, or `with_model`'s (a draft model's Drafts); the tokens of one check arrive
    together, and the trial carries its draft counts."""
    import numpy as np
    from mlx_lm.generate import BatchGenerator

    from cluster.speculative.verify import install

    gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=1, prefill_batch_size=1)
    drafts = install(gen, with_model)
    prompt = [int(t) for t in np.asarray(ids).reshape(-1)]
    (uid,) = gen.insert([prompt], max_tokens=[gen_tokens])
    if drafts is not None:
        drafts.expect(uid, None)
    times: list[float] = []
    counts = None
    last_event = 0.0
    emit("progress", stage="prompt", done=0, total=int(ids.size))
    start = time.perf_counter()
    try:
        while len(times) < gen_tokens:
            _, responses = gen.next()
            now = time.perf_counter()
            for r in responses:
                times.append(round(now - start, 6))
                if r.finish_reason is not None and drafts is not None:
                    counts = drafts.forget(uid)
            if now - last_event >= PROGRESS_EVERY_S:
                emit("progress", stage="decode", tokens=len(times))
                last_event = now
    finally:
        gen.close()
    if len(times) != gen_tokens:
        raise RuntimeError(f"decoded {len(times)} tokens, expected {gen_tokens}")
    emit("progress", stage="decode", tokens=len(times))
    return {
        "token_times_s": times,
        "drafted_tokens": counts.drafted if counts else 0,
        "accepted_tokens": counts.accepted if counts else 0,
        "draft_checks": counts.checks if counts else 0,
    }
