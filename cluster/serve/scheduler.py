"""Rank 0's half of serving: which requests run, what every rank does next, what clients see.

Between two decisions every rank runs `steps` batch steps (a lease) with nothing changing; the
lease is sized from the measured step time so a new request, a cancel or a stop string waits at
most about LEASE_S for the next decision, and it ends early when a slot frees on a known step
(a sequence reaching max_tokens) while requests wait. The prompt chunk is sized the same way, so
a step of prefill takes about PREFILL_TARGET_S and keeps reporting progress however slow the
machine: a long prompt is never mistaken for a hang, and running streams wait at most one chunk.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.serve.control import Admit, Step
from cluster.serve.engine import PREFILL_BATCH
from cluster.serve.prefix_cache import PrefixCache
from cluster.serve.requests import Cancel, Output, Request, RequestError, StopScanner, parse_line

Emit = Callable[..., None]

TICK_S = 1.0  # an idle rank 0 shares a no-op this often: every rank keeps reporting progress
LEASE_S = 0.1  # the longest a decision waits while the batch runs
MAX_LEASE_STEPS = 64
PREFILL_TARGET_S = 0.5  # one step of prefill takes about this long
MIN_CHUNK = 16
FIRST_STEP_TOKENS = 64  # prompt tokens in the first prefill step, before the pace is known
STATS_EVERY_S = 1.0


class Scheduler:
    def __init__(
        self,
        tokenizer: TokenizerWrapper,
        emit: Emit,
        lines: queue.Queue[str],
        cache: PrefixCache,
        max_running: int,
        max_chunk: int,
    ) -> None:
        self.tokenizer, self.emit, self.lines, self.cache = tokenizer, emit, lines, cache
        self.max_running, self.max_chunk = max_running, max_chunk
        self.pending: deque[Request] = deque()
        self.running: dict[int, Output] = {}  # batch uid -> the request it serves
        self.remaining: dict[int, int] = {}  # batch uid -> tokens until max_tokens
        self.leaving: list[int] = []  # uids to take out at the next decision
        self.prefilling: set[int] = set()  # uids whose prompt is still being read
        self.step_s = 0.0  # recent decode step time (EMA); 0 until measured
        self.prefill_rate = 0.0  # prompt tokens per second (EMA); 0 until measured
        self._read: dict[int, int] = {}  # uid -> prompt tokens read so far
        self._admitted: list[tuple[Request, int]] = []  # this decision's requests, with reuse
        self._last_stats = 0.0

    # --- deciding -------------------------------------------------------------------------------
    def decide(self) -> bytes:
        """The next step message. Blocks up to TICK_S only when there is nothing to do."""
        busy = bool(self.running or self.pending)
        self._intake(block_s=0.0 if busy else TICK_S)
        add: list[Admit] = []
        self._admitted = []
        while self.pending and len(self.running) + len(add) < self.max_running:
            request = self.pending.popleft()
            hit = self.cache.lookup(request.ids)
            entry, reuse = hit if hit is not None else (None, 0)
            add.append(
                Admit(
                    ids=request.ids[reuse:],
                    max_tokens=request.max_tokens,
                    temperature=request.temperature,
                    top_p=request.top_p,
                    seed=request.seed,
                    entry=entry,
                    reuse=reuse,
                )
            )
            self._admitted.append((request, reuse))
        leaving, self.leaving = self.leaving, []
        steps = self._lease(len(add)) if self.running or add else 0
        return Step(steps=steps, chunk=self._chunk(len(add)), add=add, remove=leaving).encode()

    def _lease(self, joining: int) -> int:
        if joining or self.prefilling or self.step_s <= 0:
            return 1  # a prefill step is already long (about PREFILL_TARGET_S): decide each time
        steps = int(LEASE_S / self.step_s)
        if self.pending and self.remaining:  # a slot frees when the nearest max_tokens is hit
            steps = min(steps, min(self.remaining.values()))
        return max(1, min(steps, MAX_LEASE_STEPS))

    def _chunk(self, joining: int) -> int:
        """Prompt tokens per sequence in the next step: a prefill step of all the prompts being
        read takes about PREFILL_TARGET_S at the measured pace."""
        prompts = max(1, min(len(self.prefilling) + joining, PREFILL_BATCH))
        budget = self.prefill_rate * PREFILL_TARGET_S if self.prefill_rate else FIRST_STEP_TOKENS
        return max(MIN_CHUNK, min(self.max_chunk, int(budget / prompts)))

    def _intake(self, block_s: float) -> None:
        try:
            lines = [self.lines.get(timeout=block_s) if block_s > 0 else self.lines.get_nowait()]
        except queue.Empty:
            return
        while True:
            try:
                lines.append(self.lines.get_nowait())
            except queue.Empty:
                break
        for line in lines:
            try:
                item = parse_line(line, self.tokenizer)
            except RequestError as e:
                self.emit("request_error", id=e.request_id, kind="input", message=str(e))
                continue
            if isinstance(item, Cancel):
                self._cancel(item.id)
            else:
                self.pending.append(item)

    def _cancel(self, request_id: str) -> None:
        self.pending = deque(r for r in self.pending if r.id != request_id)
        for uid, out in list(self.running.items()):
            if out.request.id == request_id:
                self._leave(uid)

    def _leave(self, uid: int) -> None:
        self._forget(uid)
        self.leaving.append(uid)

    def _forget(self, uid: int) -> None:
        self.running.pop(uid, None)
        self.remaining.pop(uid, None)
        self.prefilling.discard(uid)
        self._read.pop(uid, None)

    def admitted(self, uids: list[int]) -> None:
        """The batch took this decision's requests as `uids` (in order)."""
        for uid, (request, reuse) in zip(uids, self._admitted, strict=True):
            self.running[uid] = Output(
                request, reuse, self.tokenizer.detokenizer, StopScanner(request.stop)
            )
            self.remaining[uid] = request.max_tokens
            self.prefilling.add(uid)
            self.emit("begin", id=request.id, prompt_tokens=len(request.ids), cached_tokens=reuse)

    # --- observing ------------------------------------------------------------------------------
    def observe(self, prompt_responses: list[Any], responses: list[Any], took_s: float) -> None:
        """One step's results: text to the clients, finished requests, the step's pace."""
        read = 0
        for r in prompt_responses:
            read += r.progress[0] - self._read.get(r.uid, 0)
            self._read[r.uid] = r.progress[0]
            if (out := self.running.get(r.uid)) is not None and not r.end_of_prompt:
                # The request's own sign of life while its prompt is read (minutes, maybe).
                total = r.progress[1] + out.cached
                self.emit(
                    "prompt_progress",
                    id=out.request.id,
                    read=r.progress[0] + out.cached,
                    total=total,
                )
            if r.end_of_prompt:
                self.prefilling.discard(r.uid)
                self._read.pop(r.uid, None)
        for r in responses:
            out = self.running.get(r.uid)
            if out is not None:
                self._token(r.uid, out, r.token, r.finish_reason)
        self._pace(read, bool(responses), took_s)

    def _token(self, uid: int, out: Output, token: int, finish: str | None) -> None:
        self.remaining[uid] = self.remaining.get(uid, 1) - 1
        detok = out.detokenizer
        if finish != "stop":  # a "stop" step carries the end-of-turn token: not text
            out.tokens.append(token)
            detok.add_token(token)
        if finish is not None:
            detok.finalize()
        piece, stopped = out.scanner.feed(detok.last_segment)
        if piece:
            self.emit("delta", id=out.request.id, text=piece)
        if stopped:  # a stop string: done for the client now, out of the batch at the next step
            self._done(out, "stop")
            self._leave(uid)
        elif finish is not None:
            if rest := out.scanner.flush():
                self.emit("delta", id=out.request.id, text=rest)
            self._done(out, finish)
            self._forget(uid)

    def _done(self, out: Output, finish: str) -> None:
        self.emit(
            "done",
            id=out.request.id,
            finish_reason=finish,
            prompt_tokens=len(out.request.ids),
            completion_tokens=len(out.tokens),
            cached_tokens=out.cached,
            token_ids=out.tokens,
        )

    def _pace(self, read: int, decoding: bool, took_s: float) -> None:
        took_s = max(took_s, 1e-4)
        if read:
            rate = read / took_s
            self.prefill_rate = (
                rate if not self.prefill_rate else 0.5 * self.prefill_rate + 0.5 * rate
            )
        elif decoding:
            self.step_s = took_s if self.step_s <= 0 else 0.8 * self.step_s + 0.2 * took_s

    def stats(self, batch: int) -> None:
        """A `stats` event at most every STATS_EVERY_S (the launcher's /metrics)."""
        now = time.monotonic()
        if now - self._last_stats < STATS_EVERY_S:
            return
        self._last_stats = now
        c = self.cache
        self.emit(
            "stats",
            running=len(self.running),
            queued=len(self.pending),
            batch=batch,
            prefix_cache_bytes=c.nbytes,
            prefix_cache_tokens=c.tokens,
            prefix_cache_entries=len(c),
            prefix_cache_hits=c.hits,
            prefix_cache_lookups=c.lookups,
        )


def _ema(old: float, new: float, weight: float) -> float:
    """A moving average that starts at the first measurement (old == 0: none yet)."""
    return new if old <= 0 else (1 - weight) * old + weight * new
