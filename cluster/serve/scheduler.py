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
from dataclasses import replace
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.serve.control import Admit, Step
from cluster.serve.engine import PREFILL_BATCH
from cluster.serve.output import ChoiceOutput
from cluster.serve.prefix_cache import PrefixCache
from cluster.serve.requests import Cancel, Limits, Request, RequestError, parse_line

Emit = Callable[..., None]
Choice = tuple[Request, int]  # a request and the index of one of its n choices

TICK_S = 1.0  # an idle rank 0 shares a no-op this often: every rank keeps reporting progress
LEASE_S = 0.25  # the longest a decision waits while the batch runs (mlx-lm: ~0.5 s)
MAX_LEASE_STEPS = 64
PREFILL_TARGET_S = 0.5  # one step of prefill takes about this long
MIN_CHUNK = 16
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
        prefill_rate: float,
        limits: Limits,
    ) -> None:
        self.tokenizer, self.lines, self.cache, self.limits = tokenizer, lines, cache, limits
        self._emit = emit
        self._out: list[dict[str, Any]] = []  # request events wait here for flush()
        self.max_running, self.max_chunk = max_running, max_chunk
        self.pending: deque[Choice] = deque()
        self.running: dict[int, ChoiceOutput] = {}  # batch uid -> the choice it serves
        # Choices 1..n-1 of a request wait until choice 0's prompt is read and cached: they
        # then start from it (n sequences sharing the prompt's prefix).
        self.siblings: dict[int, list[Choice]] = {}
        self.remaining: dict[int, int] = {}  # batch uid -> tokens until max_tokens
        self.leaving: list[int] = []  # uids to take out at the next decision
        self.prefilling: set[int] = set()  # uids whose prompt is still being read
        self.step_s = 0.0  # recent decode step time (EMA); 0 until measured
        self.prefill_rate = prefill_rate  # prompt tokens per second (EMA; first: the warm-up)
        self._read: dict[int, int] = {}  # uid -> prompt tokens read so far
        self._admitted: list[tuple[Choice, int]] = []  # this decision's choices, with reuse
        self._last_stats = 0.0

    # --- deciding -------------------------------------------------------------------------------
    def decide(self) -> bytes:
        """The next step message. Blocks up to TICK_S only when there is nothing to do."""
        busy = bool(self.running or self.pending)
        self._intake(block_s=0.0 if busy else TICK_S)
        add: list[Admit] = []
        self._admitted = []
        while self.pending and len(self.running) + len(add) < self.max_running:
            choice = self.pending.popleft()
            request, index = choice
            hit = self.cache.lookup(request.ids)
            entry, reuse = hit if hit is not None else (None, 0)
            # Each choice draws from its own key: the request's seed, stepped by the index.
            sampling = replace(request.sampling, seed=request.sampling.seed + index)
            share = index == 0 and request.n > 1  # the other choices start from its prompt
            add.append(
                Admit(request.ids[reuse:], request.max_tokens, sampling, entry, reuse, share)
            )
            self._admitted.append((choice, reuse))
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
        budget = self.prefill_rate * PREFILL_TARGET_S
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
                item = parse_line(line, self.tokenizer, self.limits)
            except RequestError as e:
                code = {"code": e.code} if e.code else {}
                self.emit("request_error", id=e.request_id, kind="input", message=str(e), **code)
                continue
            if isinstance(item, Cancel):
                self._cancel(item.id)
            elif item.count_only:  # /v1/messages/count_tokens: nothing to run
                self.emit(
                    "done",
                    id=item.id,
                    index=0,
                    finish_reason="count",
                    prompt_tokens=len(item.ids),
                    completion_tokens=0,
                    cached_tokens=0,
                )
            else:
                self.pending.append((item, 0))

    def _cancel(self, request_id: str) -> None:
        self.pending = deque(c for c in self.pending if c[0].id != request_id)
        for uid, out in list(self.running.items()):
            if out.request.id == request_id:
                self._leave(uid)

    def _leave(self, uid: int) -> None:
        self._forget(uid)
        self.leaving.append(uid)

    def _forget(self, uid: int) -> None:
        self._release(uid)
        self.running.pop(uid, None)
        self.remaining.pop(uid, None)
        self.prefilling.discard(uid)
        self._read.pop(uid, None)

    def emit(self, event: str, **fields: Any) -> None:
        self._out.append({"event": event, **fields})

    def flush(self) -> None:
        """This step's request events, as one line: a write and a parse per step, not per
        token and request."""
        out, self._out = self._out, []
        if len(out) == 1:
            self._emit(out[0].pop("event"), **out[0])
        elif out:
            self._emit("batch", events=out)

    def _release(self, uid: int) -> None:
        """Choice 0's prompt is in the cache (or it left): its siblings go first in line."""
        self.pending.extendleft(reversed(self.siblings.pop(uid, [])))

    def admitted(self, uids: list[int | str]) -> None:
        """The batch took this decision's choices as `uids` (in order); an error in place of a
        uid: that choice could not join, and its request fails alone."""
        for uid, ((request, index), reuse) in zip(uids, self._admitted, strict=True):
            if isinstance(uid, str):
                self._fail(request, f"the request's sampling settings failed: {uid}")
                continue
            self.running[uid] = ChoiceOutput(request, index, reuse, self.tokenizer, self.emit)
            self.remaining[uid] = request.max_tokens
            self.prefilling.add(uid)
            if index == 0 and request.n > 1:
                self.siblings[uid] = [(request, i) for i in range(1, request.n)]
            self.emit(
                "begin",
                id=request.id,
                index=index,
                prompt_tokens=len(request.ids),
                cached_tokens=reuse,
            )

    def _fail(self, request: Request, message: str, kind: str = "internal") -> None:
        """One request ends with an error (all its choices leave the batch); the rest go on."""
        for uid in [u for u, out in self.running.items() if out.request is request]:
            self.siblings.pop(uid, None)
            self._leave(uid)
        self.pending = deque(c for c in self.pending if c[0] is not request)
        self.emit("request_error", id=request.id, kind=kind, message=message)

    # --- observing ------------------------------------------------------------------------------
    def observe(
        self,
        prompt_responses: list[Any],
        responses: list[Any],
        took_s: float,
        faults: dict[int, str],
    ) -> None:
        """One step's results: text to the clients, finished choices, the step's pace. A
        choice whose own code failed (faults, or its output here) ends its request alone."""
        for uid, message in faults.items():
            if (out := self.running.get(uid)) is not None:
                self._fail(out.request, f"decoding failed: {message}")
        read = 0
        for r in prompt_responses:
            read += r.progress[0] - self._read.get(r.uid, 0)
            self._read[r.uid] = r.progress[0]
            out = self.running.get(r.uid)
            if r.end_of_prompt:
                self.prefilling.discard(r.uid)
                self._read.pop(r.uid, None)
                self._release(r.uid)
            elif out is not None:  # the request's own sign of life while its prompt is read
                self.emit(
                    "prompt_progress",
                    id=out.request.id,
                    index=out.index,
                    read=r.progress[0] + out.cached,
                    total=r.progress[1] + out.cached,
                )
        for r in responses:
            out = self.running.get(r.uid)
            if out is None:
                continue
            self.remaining[r.uid] = self.remaining.get(r.uid, 1) - 1
            try:
                stopped = out.token(r.token, r.finish_reason, r.logprobs)
            except Exception as e:  # detokenizing, tool parsing: this request's output only
                self._fail(out.request, f"writing the output failed: {type(e).__name__}: {e}")
                continue
            if stopped:  # a stop string: done for the client now, out of the batch next step
                self._leave(r.uid)
            elif r.finish_reason is not None:
                self._forget(r.uid)
        if read:
            self.prefill_rate = _ema(self.prefill_rate, read / max(took_s, 1e-4), 0.5)

    def stepped(self, wall_s: float, decoded: bool) -> None:
        """A whole decode step's wall time (the batch, rank 0's own work, any pause): what a
        lease is measured in."""
        if decoded:
            self.step_s = _ema(self.step_s, wall_s, 0.2)

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
