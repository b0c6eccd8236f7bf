"""The batch every rank runs: mlx-lm's BatchGenerator, fed by the step messages, plus the
prefix cache. Identical messages in, identical forward passes out, so the collectives inside the
model pair up on every rank; nothing here talks to other ranks itself."""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.serve.control import Step
from cluster.serve.prefix_cache import PrefixCache
from cluster.serve.sampling import Fault, guarded, request_processors, request_sampler
from cluster.speculative.check_width import StepCost, StepCosts, choose_width, learning_pays
from cluster.speculative.draft_length import FIRST_DRAFT
from cluster.speculative.drafts import DraftCounts, Drafts
from cluster.speculative.verify import DraftingBatch, install

# The longest prompt chunk of a step; every step message sets the chunk (Step.chunk) below it.
MAX_CHUNK = 2048
WARM_UP_TOKENS = 32
# A prompt this long enters the cache as soon as it is read, for the requests that share it
# while it decodes; shorter ones only when they finish (an early copy costs more than it saves).
SHARED_PROMPT_TOKENS = 256
PREFILL_BATCH = 8  # prompts prefilled together (mlx-lm's server default --prompt-concurrency)
# Plain decode steps before a width chosen 0 is tried at FIRST_DRAFT once (acceptance is only
# learnt by checking drafts); doubles while probes do not pay, up to MAX_PROBE_EVERY.
PROBE_EVERY = 16
MAX_PROBE_EVERY = 256


class Engine:
    def __init__(
        self,
        model: nn.Module,
        tokenizer: TokenizerWrapper,
        stream: Any,
        max_running: int,
        cache_tokens: int,
        speculative: bool = True,
        drafts: Drafts | None = None,  # a draft model's (speculative/exchange.py); None: lookup
    ) -> None:
        self.tokenizer = tokenizer
        self.gen = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
            completion_batch_size=max_running,
            prefill_batch_size=min(max_running, PREFILL_BATCH),
            prefill_step_size=MAX_CHUNK,
            stream=stream,
        )
        self.cache = PrefixCache(cache_tokens)
        # Drafts are checked in the batch when every layer's cache can rewind row by row (off:
        # mlx-lm's own generation batch, untouched).
        self.drafts: Drafts | None = install(self.gen, drafts) if speculative else None
        batch = self.gen._generation_batch if self.drafts is not None else None
        self._batch = batch if isinstance(batch, DraftingBatch) else None
        self.costs = StepCosts()  # this rank's decode steps; rank 0's choose the width
        self.width: int | None = None  # the width the step messages set (None: the bound)
        self._since_check = 0  # plain decode steps since the last checking forward
        self._after_check = False  # whether the last measured step checked drafts
        self._probe_every = PROBE_EVERY
        self._draft_counts: dict[int, DraftCounts] = {}  # uids that finished this step
        self.active: set[int] = set()  # uids inserted and not yet finished or removed
        self.faults: dict[int, Fault] = {}  # uid -> what its sampler/processors raised
        self._share_prompt: set[int] = set()  # uids whose prompt is cached once read
        self.prefill_rate = self._warm_up(model, stream)

    @staticmethod
    def _warm_up(model: nn.Module, stream: Any) -> float:
        """One short prompt through the model on every rank before serving (its collectives
        pair up like any forward's): kernels are ready for the first request, and rank 0
        learns the prefill pace its first prompt chunk is sized from. Tokens per second."""
        ids = mx.zeros((1, WARM_UP_TOKENS), dtype=mx.int32)
        with mx.stream(stream):
            started = time.perf_counter()
            mx.eval(model(ids, cache=make_prompt_cache(model)))
            return WARM_UP_TOKENS / max(time.perf_counter() - started, 1e-6)

    @property
    def idle(self) -> bool:
        return not self.active

    def apply(self, step: Step) -> list[int | str]:
        """Removals, the prompt chunk, then the new sequences; returns their uids in order (or,
        for one whose sampler or processors could not be built, the error: it never joins)."""
        if step.remove:
            self.gen.remove(step.remove)
            self.active.difference_update(step.remove)
            self._share_prompt.difference_update(step.remove)
            for uid in step.remove:
                if self.drafts is not None:
                    self.drafts.forget(uid)
        if step.chunk:
            self.gen.prefill_step_size = min(step.chunk, MAX_CHUNK)
        if step.draft_width is not None and self._batch is not None:
            self.width = self._batch.width = step.draft_width
        uids: list[int | str] = []
        for a in step.add:
            fault = Fault()
            try:  # the request's own settings (a seed, a grammar) must not stop the batch
                sampler, processors = guarded(
                    request_sampler(a.sampling),
                    request_processors(a.sampling, self.tokenizer),
                    fault,
                )
            except Exception as e:
                fault.catch(e)
                uids.append(str(fault.message))
                continue
            cache, head = self.cache.take(a.entry, a.reuse) if a.entry is not None else (None, [])
            (uid,) = self.gen.insert_segments(
                [[a.ids]],
                max_tokens=[a.max_tokens],
                caches=None if cache is None else [cache],  # None: a fresh cache
                all_tokens=[head],
                samplers=None if sampler is None else [sampler],  # None: the shared argmax
                logits_processors=[processors],
            )
            uids.append(uid)
            self.active.add(uid)
            if self.drafts is not None:
                self.drafts.expect(uid, a.prediction)
            self.faults[uid] = fault
            if a.share_prompt:
                self._share_prompt.add(uid)
        return uids

    def failed(self) -> dict[int, str]:
        """Sequences whose sampler or processors raised since the last call (uid -> error)."""
        out = {u: f.message for u, f in self.faults.items() if f.message is not None}
        self.faults = {u: f for u, f in self.faults.items() if u in self.active and u not in out}
        return out

    def next(self) -> tuple[list[Any], list[Any]]:
        """One step: a decode step for the running sequences and one chunk of prompt.

        Prompts that finish prefill and sequences that finish decoding enter the prefix cache
        (in-flight ones with their prompt, finished ones with prompt and answer), on every rank
        at the same step."""
        self._draft_counts = {}
        prompt_responses, responses = self.gen.next()
        prefilled = [
            r.uid
            for r in prompt_responses
            if r.end_of_prompt
            and (r.progress[1] >= SHARED_PROMPT_TOKENS or r.uid in self._share_prompt)
        ]
        self._share_prompt.difference_update(prefilled)
        for cache, tokens in self.gen.extract_cache(prefilled).values():
            self.cache.insert(list(tokens), cache)
        for r in responses:
            if r.finish_reason is not None:
                self.active.discard(r.uid)
                self.cache.insert(list(r.all_tokens), r.prompt_cache)
                counts = self.drafts.forget(r.uid) if self.drafts is not None else None
                if counts is not None:
                    self._draft_counts[r.uid] = counts
        return prompt_responses, responses

    def measured(self, seconds: float) -> None:
        """The wall time of a step that only decoded, on this rank, as the forward it ran costs.

        Plain steps run one ahead (mlx-lm computes the next while this one returns), checks do
        not: the first check after plain steps first waits for the plain forward in flight (its
        time is taken off, as that forward's own), and the plain step after a check only starts
        the next forward (nothing to record)."""
        batch = self._batch
        if batch is None or not batch.positions:
            return
        after_check, self._after_check = self._after_check, batch.checked
        if batch.checked:
            self._since_check = 0
            if not after_check:
                in_flight = self.costs.means.get((batch.rows, False))
                if in_flight is None:
                    return
                # A check reads more positions than that plain forward: on a loaded machine
                # the difference can come out at nothing, which would leave the check unseen.
                seconds = max(seconds - in_flight, in_flight)
            self.costs.record(batch.positions, seconds, True)
        else:
            self._since_check += 1
            if not after_check:
                self.costs.record(batch.positions, seconds)

    def check_width(self) -> int | None:
        """Rank 0: the draft width for the next steps, the one with the most tokens per second
        by the measured step costs and the running sequences' prospects; None while the costs
        are not measured yet (the bound applies) or nothing can draft."""
        fit = self.costs.fit()
        if self.drafts is None or self._batch is None or fit is None:
            return None
        prospects = [p for uid in self._batch.uids if (p := self.drafts.prospect(uid))]
        if not prospects:
            return None
        rows = len(self._batch.uids)
        packed = self._batch.packs
        width = choose_width(fit, prospects, rows, packed=packed)
        # A check made only to learn is short: unless the check packs, every row pays for it
        # (one drafted token a row in a batch, a few alone).
        learn = FIRST_DRAFT if packed else max(1, FIRST_DRAFT // rows)
        fresh = any(p.fresh and p.limit for p in prospects)
        if width < learn and fresh and learning_pays(fit, prospects, rows, packed):
            width = learn  # a new sequence's worth is learnt by asking it a few times
        elif width > 0:
            self._probe_every = PROBE_EVERY
        elif self._since_check >= self._probe_every and any(p.limit for p in prospects):
            # a rate learnt long ago says little now: check a short draft once
            width, self._since_check = learn, 0
            self._probe_every = min(2 * self._probe_every, MAX_PROBE_EVERY)
        return width

    def step_cost(self) -> StepCost | None:
        """The fitted step cost (check_width.py)."""
        return self.costs.fit()

    def draft_counts(self, uid: int) -> DraftCounts | None:
        """A sequence's draft counts while it runs, or in the step it finished."""
        running = self.drafts.counts(uid) if self.drafts is not None else None
        return running if running is not None else self._draft_counts.get(uid)
