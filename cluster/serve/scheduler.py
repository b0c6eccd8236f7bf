"""Rank 0's half of serving: which requests run, what every rank does next, what clients see.

At each decision the launcher's new lines are read and the head of the waiting line joins the
batch while the policy allows (admission.py), the lease and the prompt chunk are sized from the
measured pace (pacing.py), and the decision leaves as one step message (control.py). Each step's
results reach the clients through each choice's output (output.py), gathered into one line per
step (events.py).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.generate import Emit
from cluster.serve.admission import Admission, AdmissionPolicy, Intake, Joining, worst_case
from cluster.serve.control import Step
from cluster.serve.events import LauncherEvents
from cluster.serve.kv_budget import batch_tokens
from cluster.serve.output import ChoiceOutput
from cluster.serve.pacing import Pacing
from cluster.serve.prefix_cache import PrefixCache
from cluster.serve.requests import Cancel, Limits, Request
from cluster.speculative.check_width import StepCost
from cluster.speculative.drafts import DraftCounts

TICK_S = 1.0  # an idle rank 0 shares a no-op this often: every rank keeps reporting progress


class DraftSource(Protocol):
    """The engine's side of drafting, as rank 0's scheduler reads it."""

    width: int | None  # the draft width the last step message set (None: the bound)

    def draft_counts(self, uid: int) -> DraftCounts | None: ...

    def check_width(self) -> int | None: ...

    def step_cost(self) -> StepCost | None: ...


@dataclass
class RunningChoice:
    """Rank 0's record of one choice in the batch (under its uid); changes every step."""

    output: ChoiceOutput
    remaining: int  # tokens until max_tokens
    worst: int  # its most KV positions (prompt + max_tokens): what the memory budget holds for it
    prefilling: bool = True  # its prompt is still being read


class Scheduler:
    """Rank 0's decisions, and what it makes of each step's results."""

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
        drafts: DraftSource | None = None,
        kv_limit: int | None = None,  # the memory budget in KV positions (None: count only)
    ) -> None:
        self.tokenizer, self.cache = tokenizer, cache
        self.drafts = drafts  # the engine's draft counts per uid (None: no drafting)
        self.events = LauncherEvents(emit)
        self.intake = Intake(lines, tokenizer, limits, self.events.emit)
        policy = AdmissionPolicy(max_running, kv_limit, cache.max_tokens)
        self.admission = Admission(policy, cache)
        self._cache_sent = cache.limit  # the prefix cache's bound the other ranks hold
        self.pacing = Pacing(max_chunk, prefill_rate)
        self.running: dict[int, RunningChoice] = {}  # batch uid -> the choice it serves
        self.leaving: list[int] = []  # uids to take out at the next decision
        self._joining: list[Joining] = []  # this decision's choices, in the step's order

    # --- deciding -------------------------------------------------------------------------------
    def decide(self) -> bytes:
        """The next step message. Blocks up to TICK_S only when there is nothing to do."""
        busy = bool(self.running or self.admission.waiting)
        for item in self.intake.read(block_s=0.0 if busy else TICK_S):
            if isinstance(item, Cancel):
                self._cancel(item.id)
            else:
                self.admission.enqueue(item)
        self._joining = self.admission.choose([c.worst for c in self.running.values()])
        joining, prefilling = len(self._joining), self._prefilling()
        leaving, self.leaving = self.leaving, []
        steps = self._lease(joining, prefilling) if self.running or joining else 0
        add = [j.admit for j in self._joining]
        chunk = self.pacing.chunk(joining, prefilling)
        bound = None if self.cache.limit == self._cache_sent else self.cache.limit
        self._cache_sent = self.cache.limit
        width = None
        if self.drafts is not None and steps:
            width = self.drafts.check_width()
            width = None if width == self.drafts.width else width  # unchanged: not resent
        step = Step(
            steps=steps,
            chunk=chunk,
            add=add,
            remove=leaving,
            cache_tokens=bound,
            draft_width=width,
        )
        return step.encode()

    def _prefilling(self) -> int:
        return sum(c.prefilling for c in self.running.values())

    def _lease(self, joining: int, prefilling: int) -> int:
        free_slot_in = None
        if self.admission.waiting and self.running:  # a slot frees at the nearest max_tokens
            free_slot_in = min(c.remaining for c in self.running.values())
        return self.pacing.lease(joining, prefilling, free_slot_in)

    def admitted(self, uids: list[int | str]) -> None:
        """The batch took this decision's choices as `uids` (in order); an error in place of a
        uid: that choice could not join, and its request fails alone."""
        for uid, joined in zip(uids, self._joining, strict=True):
            request = joined.request
            if isinstance(uid, str):
                self._fail(request, f"the request's sampling settings failed: {uid}")
                continue
            output = ChoiceOutput(
                request,
                joined.index,
                joined.reuse,
                self.tokenizer,
                self.events.emit,
                None if self.drafts is None else partial(self.drafts.draft_counts, uid),
            )
            self.running[uid] = RunningChoice(output, request.max_tokens, worst_case(request))
            self.admission.hold_siblings(uid, joined)
            self.events.emit(
                "begin",
                id=request.id,
                index=joined.index,
                prompt_tokens=len(request.ids),
                cached_tokens=joined.reuse,
            )

    def _cancel(self, request_id: str) -> None:
        self.admission.withdraw(request_id)
        for uid, choice in list(self.running.items()):
            if choice.output.request.id == request_id:
                self._leave(uid)

    def _leave(self, uid: int) -> None:
        self._forget(uid)
        self.leaving.append(uid)

    def _forget(self, uid: int) -> None:
        self.admission.release(uid)
        self.running.pop(uid, None)
        self.pacing.forget(uid)

    def _fail(self, request: Request, message: str) -> None:
        """One request ends with an error (all its choices leave the batch); the rest go on."""
        for uid in [u for u, c in self.running.items() if c.output.request is request]:
            self.admission.drop_siblings(uid)
            self._leave(uid)
        self.admission.drop(request)
        self.events.emit("request_error", id=request.id, kind="internal", message=message)

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
            if (choice := self.running.get(uid)) is not None:
                self._fail(choice.output.request, f"decoding failed: {message}")
        self.pacing.prompt_read(prompt_responses, took_s)
        for r in prompt_responses:
            choice = self.running.get(r.uid)
            if r.end_of_prompt:
                if choice is not None:
                    choice.prefilling = False
                self.admission.release(r.uid)
            elif choice is not None:  # the request's own sign of life while its prompt is read
                out = choice.output
                self.events.emit(
                    "prompt_progress",
                    id=out.request.id,
                    index=out.index,
                    read=r.progress[0] + out.cached,
                    total=r.progress[1] + out.cached,
                )
        for r in responses:
            if (choice := self.running.get(r.uid)) is None:
                continue
            choice.remaining -= 1
            try:
                stopped = choice.output.token(r.token, r.finish_reason, r.logprobs)
            except Exception as e:  # detokenizing, tool parsing: this request's output only
                message = f"writing the output failed: {type(e).__name__}: {e}"
                self._fail(choice.output.request, message)
                continue
            if stopped:  # a stop string: done for the client now, out of the batch next step
                self._leave(r.uid)
            elif r.finish_reason is not None:
                self._forget(r.uid)

    def stepped(self, wall_s: float, decoded: bool) -> None:
        """A step's wall time; only decode steps measure the lease."""
        if decoded:
            self.pacing.decode_step(wall_s)

    def stats(self, batch: int) -> None:
        """A `stats` event at most every STATS_EVERY_S (the launcher's /metrics)."""
        reserved = batch_tokens(c.worst for c in self.running.values())
        drafting = None
        if self.drafts is not None:
            drafting = (self.drafts.width, self.drafts.step_cost())
        self.events.stats(
            len(self.running), len(self.admission.waiting), batch, self.cache, reserved, drafting
        )

    def flush(self) -> None:
        self.events.flush()
