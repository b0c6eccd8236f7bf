"""Who joins the batch: the launcher's lines read into requests, the line they wait in, and the
policy that lets the head of that line in at a decision.

Choices 1..n-1 of a request wait aside until choice 0's prompt is read and cached: they then go
first in line and start from it (n sequences sharing the prompt's prefix).
"""

from __future__ import annotations

import queue
from collections import deque
from dataclasses import dataclass, replace

from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.generate import Emit
from cluster.serve.control import Admit
from cluster.serve.kv_budget import batch_tokens
from cluster.serve.prefix_cache import PrefixCache
from cluster.serve.requests import Cancel, Limits, Request, RequestError, parse_line

Choice = tuple[Request, int]  # a request and the index of one of its n choices


class Intake:
    """The launcher's lines on rank 0's stdin as requests to run and cancels, in order. A line
    that runs nothing (a bad request, a token count) is answered here."""

    def __init__(
        self, lines: queue.Queue[str], tokenizer: TokenizerWrapper, limits: Limits, emit: Emit
    ) -> None:
        self.lines, self.tokenizer, self.limits, self.emit = lines, tokenizer, limits, emit

    def read(self, block_s: float) -> list[Request | Cancel]:
        """Every line waiting now; blocks up to `block_s` for the first (0: not at all)."""
        try:
            lines = [self.lines.get(timeout=block_s) if block_s > 0 else self.lines.get_nowait()]
        except queue.Empty:
            return []
        while True:
            try:
                lines.append(self.lines.get_nowait())
            except queue.Empty:
                break
        items: list[Request | Cancel] = []
        for line in lines:
            try:
                item = parse_line(line, self.tokenizer, self.limits)
            except RequestError as e:
                code = {"code": e.code} if e.code else {}
                self.emit("request_error", id=e.request_id, kind="input", message=str(e), **code)
                continue
            if isinstance(item, Request) and item.count_only:  # /v1/messages/count_tokens
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
                items.append(item)
        return items


@dataclass(frozen=True)
class AdmissionPolicy:
    """Whether the head of the line may join the batch now: a free place (--max-concurrency)
    and room in the KV memory budget for every sequence's worst case, as the batch lays it
    out (kv_budget.py). The prefix cache's share of the budget is lent to the batch: the cache
    shrinks before a request waits for memory, and grows back as sequences leave."""

    max_running: int  # sequences decoding at once (--max-concurrency)
    kv_limit: int | None = None  # KV positions batch and prefix cache may hold (None: unbounded)
    cache_share: int = 0  # the prefix cache's bound when the batch does not need its share

    def admits(self, request: Request, running: int, joining: int) -> bool:
        return running + joining < self.max_running

    def fits(self, worst: list[int]) -> bool:
        return self.kv_limit is None or batch_tokens(worst) <= self.kv_limit

    def cache_room(self, worst: list[int]) -> int:
        """The prefix cache's bound beside a batch with these worst cases."""
        if self.kv_limit is None:
            return self.cache_share
        return max(0, min(self.cache_share, self.kv_limit - batch_tokens(worst)))


def worst_case(request: Request) -> int:
    """One choice's most KV positions: its whole prompt (a reused prefix included) + max_tokens."""
    return len(request.ids) + request.max_tokens


@dataclass(frozen=True)
class Joining:
    """A choice let into the batch at this decision: what every rank needs (`admit`) and what
    rank 0 keeps to follow it."""

    request: Request
    index: int
    reuse: int  # prompt tokens taken from the prefix cache
    admit: Admit


class Admission:
    """Requests waiting for a place in the batch, first come first served, and which of them
    join at a decision."""

    def __init__(self, policy: AdmissionPolicy, cache: PrefixCache) -> None:
        self.policy, self.cache = policy, cache
        self.waiting: deque[Choice] = deque()
        self.siblings: dict[int, list[Choice]] = {}  # choice 0's uid -> the choices after it

    def enqueue(self, request: Request) -> None:
        self.waiting.append((request, 0))

    def choose(self, running: list[int]) -> list[Joining]:
        """The choices that join now (`running`: the batch's worst cases), each starting from
        the longest cached prefix of its prompt. The prefix cache is bounded to what the batch
        leaves of the budget before any lookup, so no chosen entry is evicted after."""
        joining: list[Joining] = []
        worst = list(running)
        while self.waiting and self.policy.admits(self.waiting[0][0], len(running), len(joining)):
            if not self.policy.fits([*worst, worst_case(self.waiting[0][0])]):
                break  # it waits (first come, first served) until sequences leave
            request, index = self.waiting.popleft()
            worst.append(worst_case(request))
            self.cache.bound(self.policy.cache_room(worst))
            hit = self.cache.lookup(request.ids)
            entry, reuse = hit if hit is not None else (None, 0)
            # Each choice draws from its own key: the request's seed, stepped by the index.
            sampling = replace(request.sampling, seed=request.sampling.seed + index)
            share = index == 0 and request.n > 1  # the other choices start from its prompt
            admit = Admit(
                request.ids[reuse:],
                request.max_tokens,
                sampling,
                entry,
                reuse,
                share,
                request.prediction,
            )
            joining.append(Joining(request, index, reuse, admit))
        self.cache.bound(self.policy.cache_room(worst))  # grows back as sequences leave
        return joining

    def hold_siblings(self, uid: int, joined: Joining) -> None:
        """Choice 0 of an n > 1 request joined as `uid`: the others wait for its prompt."""
        if joined.index == 0 and joined.request.n > 1:
            self.siblings[uid] = [(joined.request, i) for i in range(1, joined.request.n)]

    def release(self, uid: int) -> None:
        """Choice 0's prompt is in the cache (or it left): its siblings go first in line."""
        self.waiting.extendleft(reversed(self.siblings.pop(uid, [])))

    def drop_siblings(self, uid: int) -> None:
        self.siblings.pop(uid, None)

    def withdraw(self, request_id: str) -> None:
        """A cancel: the request's choices stop waiting."""
        self.waiting = deque(c for c in self.waiting if c[0].id != request_id)

    def drop(self, request: Request) -> None:
        """A failed request: none of its choices will run."""
        self.waiting = deque(c for c in self.waiting if c[0] is not request)
