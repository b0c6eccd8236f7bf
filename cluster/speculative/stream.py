"""One prompt decoded with drafts, for `launch`: mlx-lm's stream_generate contract (the same
responses, text segments, counts and finish reasons) over a batch of one whose steps check
prompt-lookup drafts (verify.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator, GenerationResponse
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.speculative.drafts import DraftCounts, Drafts
from cluster.speculative.verify import install

NO_LIMIT = 1 << 40  # max_tokens -1: until the end-of-turn token


class DraftedStream:
    """Iterates stream_generate's responses; `counts` are the draft counts once it ended.
    sampler None: greedy (all positions of a check drawn in one batched argmax)."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: TokenizerWrapper,
        ids: list[int],
        *,
        max_tokens: int,
        sampler: Callable[[mx.array], mx.array] | None,
        logits_processors: list[Callable[[mx.array, mx.array], mx.array]] | None,
        prefill_step_size: int,
        prompt_progress_callback: Callable[[int, int], None],
        drafts: Drafts | None = None,  # a draft model's (exchange.py); None: prompt lookup
    ) -> None:
        self.model, self.tokenizer, self.ids = model, tokenizer, ids
        self.max_tokens, self.sampler, self.processors = max_tokens, sampler, logits_processors
        self.prefill_step_size, self.progress = prefill_step_size, prompt_progress_callback
        self.counts: DraftCounts | None = None
        self.drafts = drafts

    def __iter__(self) -> Iterator[GenerationResponse]:
        model, tokenizer, ids = self.model, self.tokenizer, self.ids
        gen = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
            completion_batch_size=1,
            prefill_batch_size=1,
            prefill_step_size=self.prefill_step_size,
        )
        drafts = install(
            gen, self.drafts
        )  # None: the model's caches cannot rewind, plain steps only
        (uid,) = gen.insert(
            [ids],
            max_tokens=[self.max_tokens if self.max_tokens > 0 else NO_LIMIT],
            samplers=None if self.sampler is None else [self.sampler],
            logits_processors=[self.processors or []],
        )
        if drafts is not None:
            drafts.expect(uid, None)
        detokenizer = tokenizer.detokenizer
        detokenizer.reset()
        started = time.perf_counter()
        prompt_tps, n = 0.0, 0
        try:
            while True:
                prompt_responses, responses = gen.next()
                for p in prompt_responses:
                    self.progress(*p.progress)
                for r in responses:
                    if n == 0:
                        prompt_tps = len(ids) / (time.perf_counter() - started)
                        started = time.perf_counter()
                    n += 1
                    if r.finish_reason != "stop":
                        detokenizer.add_token(r.token)
                    if r.finish_reason is not None:
                        detokenizer.finalize()
                        self.counts = drafts.forget(uid) if drafts is not None else None
                    yield _response(r, detokenizer.last_segment, len(ids), prompt_tps, n, started)
                    if r.finish_reason is not None:
                        return
        finally:
            gen.close()


def _response(
    r: Any, text: str, prompt_tokens: int, prompt_tps: float, n: int, since: float
) -> GenerationResponse:
    return GenerationResponse(
        text=text,
        token=r.token,
        logprobs=r.logprobs,
        from_draft=False,
        prompt_tokens=prompt_tokens,
        prompt_tps=prompt_tps,
        generation_tokens=n,
        generation_tps=n / max(time.perf_counter() - since, 1e-9),
        peak_memory=mx.get_peak_memory() / 1e9,
        finish_reason=r.finish_reason,
    )
