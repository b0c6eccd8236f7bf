"""mlx-lm's GenerationBatch with drafts: when any sequence has a draft, one forward of the
target checks every sequence's drafted tokens at once (rows padded to the longest draft, the
padding not computed where the model's layers allow: packing.py), each sequence keeps the
tokens its own sampler would have produced, and its cache is rewound to its own length. When no
sequence drafts, the step is mlx-lm's own (pipelined) step.

Exact by construction: each position's token is drawn the way the plain step draws it — the
same processors over the same context, the same sampler, whose key advances once per emitted
token — and a draft token is kept only when it equals that draw. So greedy and seeded requests
give the tokens they give without drafts, and every token is drawn from the target's
distribution."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import make_prompt_cache

from cluster.speculative import packing
from cluster.speculative.drafts import Drafts
from cluster.speculative.rewind import RowOrder, ordered_rows, rewind_rows, rewindable

# Until the step costs are measured (check_width.py), a checking forward reads at most this
# many positions over the whole batch: alone a sequence checks up to 8 drafted tokens, 4
# sequences up to 3 each, 8 up to 1. 8 clients of the real model on 2 cores ran at 1.26x/1.52x
# of plain decoding with this bound, 1.03x/1.11x with 32 (README, Benchmarks).
CHECK_POSITIONS = 16


class DraftingBatch(GenerationBatch):
    drafts: Drafts | None = None  # set by the engine; None: never drafts
    packs = False  # whether a check computes only its real positions (packing.py)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order = RowOrder()
        self.width: int | None = None  # drafted tokens a forward checks (None: CHECK_POSITIONS)
        # What the last step's forward computed: rows x (width + 1) positions, or when it packs,
        # each row's own (its pending token and its draft).
        self.positions = 0
        self.rows = 0  # the rows of the last step
        self.checked = False  # whether it checked drafts

    def extend(self, batch: GenerationBatch) -> None:
        start = len(self.uids)
        super().extend(batch)
        if self.drafts is not None:
            for i in range(start, len(self.uids)):
                self.drafts.join(self.uids[i], self.tokens[i])

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        self.order.keep(self.uids)

    def extract_cache(self, idx: int) -> list[Any]:
        return ordered_rows(self.prompt_cache, idx, self.uids[idx], self.order)

    def next(self) -> list[GenerationBatch.Response]:
        self.rows = len(self.uids)
        if not self.uids:
            self.positions, self.checked = 0, False
            return []
        drafts = self._propose()
        if drafts is None:
            self.positions, self.checked = len(self.uids), False
            return super().next()
        self.checked = True
        if self.packs:
            self.positions = sum(len(d) + 1 for d in drafts)
        else:
            self.positions = len(self.uids) * (max(len(d) for d in drafts) + 1)
        return self._check(drafts)

    def _propose(self) -> list[list[int]] | None:
        """Every sequence's draft, or None when none drafts: then mlx-lm's own step keeps
        computing one step ahead (having waited for the step in flight if a sequence could draft
        and found nothing: measured here at 2-3 ms of a 90 ms step of 8 rows)."""
        if self.drafts is None or not rewindable(self.prompt_cache):
            return None
        for i, uid in enumerate(self.uids):
            self.drafts.observe(uid, self.tokens[i])
        width = self.width
        if width is None:  # every row pays for the longest draft
            width = CHECK_POSITIONS // len(self.uids) - 1
        if width < 1:
            return None
        wanting = [self.drafts.wants(uid, self.tokens[i]) for i, uid in enumerate(self.uids)]
        if not any(wanting):
            return None
        out: list[list[int]] | None = None
        if self.drafts.exchange is None or self.drafts.drafter is not None:
            pending = _ints(self._next_tokens)
            out = [
                self.drafts.propose(uid, self.tokens[i], pending[i])[:width] if wanting[i] else []
                for i, uid in enumerate(self.uids)
            ]
        if self.drafts.exchange is not None:  # rank 0's drafts, on every rank
            out = self.drafts.exchange(out)
        assert out is not None
        return out if any(out) else None

    def _check(self, drafts: list[list[int]]) -> list[GenerationBatch.Response]:
        pending = _ints(self._next_tokens)
        width = max(len(d) for d in drafts)
        rows = [[p, *d] + [p] * (width - len(d)) for p, d in zip(pending, drafts, strict=True)]
        inputs = mx.array(rows, dtype=self._next_tokens.dtype)
        lengths = [len(d) + 1 for d in drafts]
        if self.packs and min(lengths) <= width:
            with packing.only(lengths, width + 1):
                logits = self.model(inputs, cache=self.prompt_cache)
        else:
            logits = self.model(inputs, cache=self.prompt_cache)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        greedy = mx.argmax(logprobs, axis=-1)
        mx.eval(greedy, logprobs)
        greedy_rows: list[list[int]] = np.asarray(greedy).tolist()

        emitted: list[list[int]] = []
        emitted_logprobs: list[list[mx.array]] = []
        nexts: list[int] = []
        next_logprobs: list[mx.array] = []
        for i, (p, d) in enumerate(zip(pending, drafts, strict=True)):
            if self._plain(i):
                drawn, row_logprobs = self._accept_greedy(greedy_rows[i], d), logprobs[i]
                kept = len(drawn) - 1
                lps = [row_logprobs[j] for j in range(kept + 1)]
            else:
                drawn, lps = self._accept_drawn(i, logits[i], p, d)
                kept = len(drawn) - 1
            emitted.append([p, *d[:kept]])
            emitted_logprobs.append([self._next_logprobs[i], *lps[:kept]])
            nexts.append(drawn[-1])
            next_logprobs.append(lps[kept])
            if self.drafts is not None:
                self.drafts.record(self.uids[i], len(d), kept)

        rewind_rows(
            self.prompt_cache,
            self.uids,
            [width - (len(e) - 1) for e in emitted],
            self.order,
        )
        for i, e in enumerate(emitted):
            self.tokens[i].extend(e)
        self._next_tokens = mx.array(nexts, dtype=self._next_tokens.dtype)
        self._next_logprobs = next_logprobs
        return self._respond(emitted, emitted_logprobs)

    def _plain(self, i: int) -> bool:
        """No processors and the batch's shared greedy sampler: drawn in one batched argmax."""
        sampler = self.samplers[i] if self.samplers else None
        no_processors = not (self.logits_processors and self.logits_processors[i])
        return no_processors and (sampler is None or sampler is self.fallback_sampler)

    @staticmethod
    def _accept_greedy(row: list[int], draft: list[int]) -> list[int]:
        """The argmax at each position while the draft agrees, then the one that disagreed."""
        kept = 0
        while kept < len(draft) and row[kept] == draft[kept]:
            kept += 1
        return row[: kept + 1]

    def _accept_drawn(
        self, i: int, logits: mx.array, pending: int, draft: list[int]
    ) -> tuple[list[int], list[mx.array]]:
        """Position by position as the plain step would: the context grows by the token fed,
        the processors run, the sampler draws; stop at the first draw that is not the draft."""
        processors = (self.logits_processors[i] if self.logits_processors else None) or ()
        sampler = (self.samplers[i] if self.samplers else None) or self.fallback_sampler
        drawn: list[int] = []
        lps: list[mx.array] = []
        fed = [pending, *draft]
        for j in range(len(draft) + 1):
            row = logits[j : j + 1]
            if processors:
                context = self._token_context[i].update_and_fetch(mx.array([fed[j]]))
                for processor in processors:
                    row = processor(context, row)
            lp = row - mx.logsumexp(row, axis=-1, keepdims=True)
            token = sampler(lp)
            mx.eval(token, lp)
            drawn.append(_ints(token)[0])
            lps.append(lp[0])
            if j == len(draft) or drawn[-1] != draft[j]:
                break
        return drawn, lps

    def _respond(
        self, emitted: list[list[int]], logprobs: list[list[mx.array]]
    ) -> list[GenerationBatch.Response]:
        """Responses token by token; a sequence that ends mid-draft keeps the tokens up to its
        end, in its cache too."""
        keep: list[int] = []
        responses: list[GenerationBatch.Response] = []
        for i, tokens in enumerate(emitted):
            reason = None
            for n, token in enumerate(tokens):
                self._num_tokens[i] += 1
                if self._num_tokens[i] >= self.max_tokens[i]:
                    reason = "length"
                if self._matchers[i].advance(token):
                    reason = "stop"
                if reason is None:
                    responses.append(
                        self.Response(self.uids[i], token, logprobs[i][n], None, None, None)
                    )
                    continue
                cut = len(tokens) - 1 - n  # fed this step but after the end
                cache = self.extract_cache(i)
                if cut:
                    for c in cache:
                        c.trim(cut)
                all_tokens = self.tokens[i][: len(self.tokens[i]) - cut]
                responses.append(
                    self.Response(self.uids[i], token, logprobs[i][n], reason, cache, all_tokens)
                )
                break
            if reason is None:
                keep.append(i)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses


def _ints(values: mx.array) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def install(gen: BatchGenerator, drafts: Drafts | None = None) -> Drafts | None:
    """Put a DraftingBatch in `gen` (still empty) and return its drafts' registry (`drafts`,
    or prompt lookup's alone); None when the model's caches cannot give entries back (sliding
    windows, SSM layers): no drafting there."""
    if not rewindable(make_prompt_cache(gen.model)):
        return None
    batch = DraftingBatch.empty(gen.model, gen.sampler)
    batch.drafts = drafts or Drafts()
    batch.packs = packing.install(gen.model)
    gen._generation_batch = batch
    return batch.drafts
