"""Decode on every rank in lockstep with mlx-lm's own stream_generate.

Rank 0 owns the prompt: it applies the chat template and tokenizes, then every rank
receives the same token ids (an all_sum where the other ranks contribute zeros). With the
same ids, the same seed and identical logits on every rank (tensor parallel all-reduces,
pipelines all-gather the last hidden state), every rank samples the same tokens and runs the
same number of steps, so the collectives inside the model always pair up.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import GenerationResponse, generation_stream, stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.job import RankJob
from cluster.speculative.exchange import job_drafts
from cluster.speculative.stream import DraftedStream
from topology.errors import InputError

Emit = Callable[..., None]  # emit(event_name, **fields)
PROGRESS_EVERY_S = 0.5  # a progress event at most this often: cheap next to a token
# Prompt tokens per prefill step (mlx-lm's default). Each step ends with a "progress" event of
# stage "prompt" carrying `chunk`, so the launcher shows a prompt longer than one step advance.
PREFILL_STEP = 2048


@dataclass
class Decoded:
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0  # mlx-lm's count: includes an EOS it stopped on
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    finish_reason: str | None = None
    logits: list[list[float]] = field(default_factory=list)
    peak_memory_bytes: int = 0  # this rank's


def prompt_ids(job: RankJob, tokenizer: TokenizerWrapper) -> list[int]:
    """What mlx_lm.generate feeds the model for this prompt (chat template unless disabled)."""
    use_template = job.use_chat_template and tokenizer.has_chat_template
    prompt = job.prompt
    if use_template:
        messages = [{"role": "user", "content": job.prompt}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(prompt, add_special_tokens=not use_template))


def share_prompt(ids: list[int] | None, group: Any) -> list[int]:
    """Rank 0's ids on every rank: length first, then the ids (others send zeros)."""
    if group is None:
        return ids or []
    mine = ids if group.rank() == 0 and ids is not None else []
    # Rank 0 sends length + 1: a 0 means the ring failed the task (it can, without raising).
    n = mx.array([len(mine) + 1 if group.rank() == 0 else 0], dtype=mx.int32)
    length = _ints(mx.distributed.all_sum(n, group=group, stream=mx.cpu))[0] - 1
    if length < 0:
        raise RuntimeError("the prompt from rank 0 never arrived: the connection to it was lost")
    if length == 0:  # every rank then refuses the empty prompt together
        return []
    padded = mine if mine else [0] * length
    total = mx.distributed.all_sum(mx.array(padded, dtype=mx.int32), group=group, stream=mx.cpu)
    return _ints(total)


def gather_per_rank(value: float, group: Any, dtype: mx.Dtype) -> list[float]:
    """Every rank's `value`: each fills its own slot of a zero vector, then all_sum."""
    if group is None:
        return [value]
    slots = mx.zeros((group.size(),), dtype=dtype)
    slots[group.rank()] = value
    summed = mx.distributed.all_sum(slots, group=group, stream=mx.cpu)
    return [v.item() for v in np.asarray(summed).reshape(-1)]


def gather_peak_memory(peak: int, group: Any) -> list[int]:
    return [int(v) for v in gather_per_rank(peak, group, mx.int64)]


def _ints(values: mx.array) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def barrier(group: Any) -> None:
    """An all_sum nobody skips: no rank leaves while a peer still needs it."""
    if group is not None:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))


def decode(
    job: RankJob,
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    group: Any,
    emit: Emit,
    out: TextIO = sys.stdout,
) -> Decoded:
    """Run stream_generate; rank 0 streams text to `out` and reports a "result" event."""
    rank0 = job.rank == 0
    if job.max_tokens == 0 or job.max_tokens < -1:
        raise InputError(f"max tokens must be positive (or -1: no limit), not {job.max_tokens}")
    ids = share_prompt(prompt_ids(job, tokenizer) if rank0 else None, group)
    if not ids:  # every rank sees the same (empty) ids, so all of them stop here
        raise InputError("the prompt is empty after tokenization: give a --prompt")
    mx.random.seed(job.seed)
    keep_logits = int(job.options.get("return_logits", 0))
    delay = float(job.options.get("token_delay_s", 0.0))  # lets launcher tests act mid-decode
    fail = job.options.get("fail_at_token")  # {"rank": r, "token": n}: launcher tests
    prompt_delay = float(job.options.get("prompt_delay_s", 0.0))  # a slow prefill, for tests

    def prompt_progress(done: int, total: int) -> None:
        if prompt_delay and 0 < done < total:  # after each chunk (not the start, not the end)
            time.sleep(prompt_delay)
        emit("progress", rank=job.rank, stage="prompt", done=done, total=total, chunk=PREFILL_STEP)

    result = Decoded(prompt_tokens=len(ids))
    kept: list[mx.array] = []
    processors = [_logit_keeper(kept, keep_logits)] if keep_logits > 0 else None
    last_event = 0.0
    drafted: DraftedStream | None = None
    responses: Iterable[GenerationResponse]
    if job.options.get("speculative", "on") != "off":
        responses = drafted = DraftedStream(
            model,
            tokenizer,
            ids,
            max_tokens=job.max_tokens,
            sampler=None if job.temp == 0 else make_sampler(job.temp, job.top_p),
            logits_processors=processors,
            prefill_step_size=PREFILL_STEP,
            prompt_progress_callback=prompt_progress,
            drafts=job_drafts(job.options, job.rank, group, generation_stream),
        )
    else:
        responses = stream_generate(
            model,
            tokenizer,
            mx.array(ids, dtype=mx.int32),
            max_tokens=job.max_tokens,
            sampler=make_sampler(job.temp, job.top_p),
            logits_processors=processors,
            prefill_step_size=PREFILL_STEP,
            prompt_progress_callback=prompt_progress,
        )
    for response in responses:
        if response.finish_reason != "stop":  # a stop response carries the EOS token
            result.tokens.append(response.token)
        if rank0 and response.text:
            result.text += response.text
            out.write(response.text)
            out.flush()
        n = len(result.tokens)
        now = time.monotonic()
        if now - last_event >= PROGRESS_EVERY_S:
            emit("progress", rank=job.rank, stage="decode", tokens=n)
            last_event = now
        if isinstance(fail, dict) and fail.get("rank") == job.rank and fail.get("token") == n:
            raise RuntimeError(f"failing at token {n} as the job asked (fail_at_token)")
        if delay:
            time.sleep(delay)
        result.prompt_tps, result.generation_tps = response.prompt_tps, response.generation_tps
        result.finish_reason = response.finish_reason
        result.generation_tokens = response.generation_tokens
    # generate_step schedules one step ahead; its collectives may still be running on the
    # generation stream and would pair up with ours in a different order on each rank.
    mx.synchronize(generation_stream)
    result.logits = [np.asarray(row.astype(mx.float32)).tolist() for row in kept]
    result.peak_memory_bytes = int(mx.get_peak_memory())
    peaks = gather_peak_memory(result.peak_memory_bytes, group)
    if rank0:
        emit(
            "result",
            text=result.text,
            tokens=result.tokens,
            prompt_tokens=result.prompt_tokens,
            generation_tokens=result.generation_tokens,
            prompt_tps=result.prompt_tps,
            generation_tps=result.generation_tps,
            finish_reason=result.finish_reason,
            peak_memory_bytes=peaks,
            **({"logits": result.logits} if keep_logits > 0 else {}),
            **_draft_fields(drafted),
        )
    barrier(group)
    return result


def _draft_fields(drafted: DraftedStream | None) -> dict[str, int]:
    """What a decode with drafts checked: forwards that checked drafts and tokens drafted and
    kept (launch prints the tokens gained per forward)."""
    counts = drafted.counts if drafted is not None else None
    if counts is None:
        return {}
    return {
        "drafted_tokens": counts.drafted,
        "accepted_tokens": counts.accepted,
        "draft_checks": counts.checks,
    }


def _logit_keeper(kept: list[mx.array], steps: int) -> Callable[[mx.array, mx.array], mx.array]:
    """A logits processor that keeps (lazily) the raw logits of the first `steps` steps."""

    def keep(tokens: mx.array, logits: mx.array) -> mx.array:
        if len(kept) < steps:
            kept.append(logits[0])
        return logits

    return keep
