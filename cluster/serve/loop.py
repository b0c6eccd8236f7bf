"""The rank side of `mlx-cluster serve`: decode requests one at a time, every rank in lockstep.

Rank 0 takes request lines (JSON, after the job line) from its stdin, tokenizes them and
broadcasts each to every rank through MLX collectives. When no request waits it broadcasts an
empty no-op tick about once a second, so every rank keeps reporting progress and a dead peer is
noticed (the ring backend raises; the launcher's deadlines catch the rest). Every rank then runs
the same stream_generate with the same seed and the same stop-string check, so the collectives
inside the model pair up and every rank stops at the same step. Only rank 0 reports a request:
`delta` events with text, then `done` with the finish reason and token counts.
"""

from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generation_stream, stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.generate import PROGRESS_EVERY_S, Emit
from cluster.job import RankJob

TICK_S = 1.0  # an idle rank 0 broadcasts a no-op this often
# Prompt chunk size: each chunk reports progress, so a long prompt on a big model never looks
# stalled to the launcher's --rank-timeout (mlx-lm's default chunk is 2048 tokens).
PREFILL_STEP = 512


class RequestError(Exception):
    """A request rank 0 cannot run (bad prompt): reported for that request, nothing broadcast."""


@dataclass(frozen=True)
class Decoding:
    """What every rank needs to decode one request identically."""

    id: str
    ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Decoding:
        return cls(**raw)


def prompt_ids(request: dict[str, Any], tokenizer: TokenizerWrapper) -> list[int]:
    """Chat messages through the model's chat template; a raw prompt as mlx-lm encodes it."""
    if request.get("messages") is not None:
        if not tokenizer.has_chat_template:
            raise RequestError("this model has no chat template: use /v1/completions")
        try:
            ids = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True)
        except Exception as e:  # a template may reject roles or orderings
            raise RequestError(f"the chat template rejected the messages: {e}") from None
        return [int(i) for i in ids]
    if request.get("prompt_ids") is not None:
        ids = [int(i) for i in request["prompt_ids"]]
        vocab = len(tokenizer.get_vocab())
        if any(not 0 <= i < vocab for i in ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        return ids
    prompt = str(request.get("prompt", ""))
    # As stream_generate encodes a string: special tokens unless it already starts with BOS.
    bos = tokenizer.bos_token
    return list(
        tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
    )


def broadcast_bytes(payload: bytes | None, group: Any) -> bytes:
    """Rank 0's bytes on every rank: the length, then the bytes packed 4 to an int32 (the
    others send zeros). Sums of int32 are exact on every backend; int64 is not on ring/CPU."""
    if group is None:
        return payload or b""
    mine = payload if group.rank() == 0 and payload else b""
    size = mx.distributed.all_sum(mx.array([len(mine)], dtype=mx.int32), group=group, stream=mx.cpu)
    length = int(np.asarray(size)[0])
    if length == 0:
        return b""
    words = -(-length // 4)
    if mine:
        packed = np.frombuffer(mine.ljust(words * 4, b"\0"), dtype=np.int32)
    else:
        packed = np.zeros(words, dtype=np.int32)
    total = mx.distributed.all_sum(mx.array(packed), group=group, stream=mx.cpu)
    return np.asarray(total).astype(np.int32).tobytes()[:length]


class StopScanner:
    """Cuts the text before the first stop string, and holds back a tail that could still
    grow into one, so streamed text never shows part of a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""  # text not sent yet: it may be the start of a stop string

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string ended the text)."""
        text = self.pending + piece
        hits = [i for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            self.pending = ""
            return text[: min(hits)], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self.pending = text[len(text) - hold :]
        return text[: len(text) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def _next_payload(lines: queue.Queue[str], tokenizer: TokenizerWrapper, emit: Emit) -> bytes:
    """Rank 0: the next request to broadcast, or b"" (a tick) when none came within TICK_S."""
    try:
        line = lines.get(timeout=TICK_S)
    except queue.Empty:
        return b""
    request_id = ""
    try:
        request = json.loads(line)
        request_id = str(request["id"])
        ids = prompt_ids(request, tokenizer)
        if not ids:
            raise RequestError("the prompt is empty after tokenization")
        decoding = Decoding(
            id=request_id,
            ids=ids,
            max_tokens=int(request["max_tokens"]),
            temperature=float(request["temperature"]),
            top_p=float(request["top_p"]),
            seed=int(request["seed"]),
            stop=[str(s) for s in request.get("stop") or []],
        )
    except RequestError as e:
        emit("request_error", id=request_id, kind="input", message=str(e))
        return b""
    except (ValueError, KeyError, TypeError) as e:
        emit("request_error", id=request_id, kind="input", message=f"bad request line: {e}")
        return b""
    return json.dumps(decoding.__dict__).encode()


def run_request(
    d: Decoding, model: nn.Module, tokenizer: TokenizerWrapper, emit: Emit, rank: int, delay: float
) -> None:
    """Decode one request on this rank; rank 0 emits its text and the final counts."""
    if rank == 0:
        emit("begin", id=d.id)
    mx.random.seed(d.seed)
    scanner = StopScanner(d.stop)
    tokens, finish, last_event = 0, "length", time.monotonic()
    stopped = False
    for response in stream_generate(
        model,
        tokenizer,
        mx.array(d.ids, dtype=mx.int32),
        max_tokens=d.max_tokens,
        sampler=make_sampler(d.temperature, d.top_p),
        prefill_step_size=PREFILL_STEP,
        prompt_progress_callback=lambda done, total: emit(
            "progress", stage="prompt", done=done, total=total
        ),
    ):
        if response.finish_reason != "stop":  # a "stop" response carries the end-of-turn token
            tokens += 1
        piece, stopped = scanner.feed(response.text)
        if rank == 0 and piece:
            emit("delta", id=d.id, text=piece)
        if stopped:
            finish = "stop"
            break
        finish = response.finish_reason or finish
        if time.monotonic() - last_event >= PROGRESS_EVERY_S:
            emit("progress", stage="decode", tokens=tokens)
            last_event = time.monotonic()
        if delay:
            time.sleep(delay)
    # Ending early (stop string, end-of-turn) leaves the next step's forward pass, collectives
    # included, queued on the generation stream: finish it before the next broadcast on the
    # CPU stream, or the ranks' collectives pair up out of order.
    mx.synchronize(generation_stream)
    if rank == 0:
        if rest := "" if stopped else scanner.flush():  # text after a stop string is dropped
            emit("delta", id=d.id, text=rest)
        emit(
            "done",
            id=d.id,
            finish_reason=finish,
            prompt_tokens=len(d.ids),
            completion_tokens=tokens,
        )


def serve(
    job: RankJob,
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    group: Any,
    emit: Emit,
    lines: queue.Queue[str],
) -> None:
    """Serve until the launcher closes stdin (the rank's stdin watcher then exits the process)."""
    rank0 = job.rank == 0
    delay = float(job.options.get("token_delay_s", 0.0))  # lets tests act mid-request
    ready, last_event = False, 0.0
    while True:
        payload = _next_payload(lines, tokenizer, emit) if rank0 else None
        data = broadcast_bytes(payload, group)
        if not ready:
            ready = True  # every rank has joined a collective: all are loaded
            if rank0:
                emit("ready", world_size=1 if group is None else group.size())
        if data:
            run_request(
                Decoding.from_json(json.loads(data)), model, tokenizer, emit, job.rank, delay
            )
        elif time.monotonic() - last_event >= PROGRESS_EVERY_S:
            emit("progress", stage="decode", tokens=0, idle=True)
            last_event = time.monotonic()
