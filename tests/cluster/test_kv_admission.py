"""KV memory admission on rank 0, with real mlx-lm caches in the prefix cache: a request joins
only while every running sequence's worst case fits the budget as mlx-lm's batch lays it out,
the prefix cache gives its share back before a request waits, each of n choices counts, and the
step message carries the cache's new bound so every rank evicts the same entries."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from cluster.serve.admission import Admission, AdmissionPolicy, worst_case
from cluster.serve.control import Sampling, Step
from cluster.serve.kv_budget import batch_tokens, per_choice_limit
from cluster.serve.prefix_cache import PrefixCache
from cluster.serve.requests import Request


def kv(n: int) -> list[KVCache]:
    c = KVCache()
    c.update_and_fetch(mx.zeros((1, 1, n, 4)), mx.zeros((1, 1, n, 4)))
    return [c]


def request(name: str, prompt: int, max_tokens: int, n: int = 1) -> Request:
    return Request(name, list(range(1000, 1000 + prompt)), max_tokens, Sampling(), n=n)


def test_the_batch_costs_its_longest_row_rounded_up_and_doubled_while_it_grows() -> None:
    assert batch_tokens([]) == 0
    assert batch_tokens([10]) == 2 * 256
    assert batch_tokens([10, 300]) == 2 * 2 * 512  # the short row is padded to the long one
    assert per_choice_limit(2048, 1) == 1024
    assert per_choice_limit(2048, 2) == 512  # n choices: n rows
    assert per_choice_limit(1000, 1) == 256


def test_requests_wait_for_memory_not_for_a_count() -> None:
    cache = PrefixCache(max_tokens=0)
    admission = Admission(AdmissionPolicy(max_running=8, kv_limit=2048), cache)
    for i in range(4):
        admission.enqueue(request(f"r{i}", 20, 400))  # 420 → 512 positions, 1,024 while growing
    joined = admission.choose([])
    assert [j.request.id for j in joined] == ["r0", "r1"]  # 2 × 1,024 = 2,048: full
    running = [worst_case(j.request) for j in joined]
    assert admission.choose(running) == []  # the next one waits, first come first served
    assert len(admission.waiting) == 2
    assert [j.request.id for j in admission.choose(running[:1])] == ["r2"]  # one left: room


def test_without_a_budget_only_the_count_limits() -> None:
    admission = Admission(AdmissionPolicy(max_running=3), PrefixCache(max_tokens=100))
    for i in range(5):
        admission.enqueue(request(f"r{i}", 20, 100_000))
    assert len(admission.choose([])) == 3


def test_the_prefix_cache_gives_memory_back_before_a_request_waits() -> None:
    cache = PrefixCache(max_tokens=1024)
    cache.insert(list(range(600)), kv(600))
    cache.insert(list(range(5000, 5300)), kv(300))
    assert cache.tokens == 900
    admission = Admission(AdmissionPolicy(8, kv_limit=2560, cache_share=1024), cache)
    admission.enqueue(request("a", 20, 400))  # 1,024 positions while growing
    admission.choose([])
    assert cache.limit == 1024 and cache.tokens == 900  # room for both: nothing evicted
    admission.enqueue(request("b", 20, 400))
    joined = admission.choose([worst_case(request("a", 20, 400))])
    assert [j.request.id for j in joined] == ["b"]  # it joins instead of waiting...
    assert cache.limit == 2560 - 2 * 1024 and cache.tokens == 300  # ...as the oldest entry goes
    assert Step.decode(Step(cache_tokens=0).encode()).cache_tokens == 0  # a bound of 0 travels
    assert Step.decode(Step().encode()).cache_tokens is None  # no change: nothing sent
    admission.choose([])  # the batch emptied: the cache may hold its whole share again
    assert cache.limit == 1024


def test_each_of_n_choices_counts() -> None:
    cache = PrefixCache(max_tokens=0)
    admission = Admission(AdmissionPolicy(8, kv_limit=2048), cache)
    two = request("two", 20, 400, n=2)
    admission.enqueue(two)
    (first,) = admission.choose([])  # choice 0 first; the other waits for its prompt
    admission.hold_siblings(7, first)
    admission.enqueue(request("late", 20, 400))
    admission.release(7)  # the prompt is read: choice 1 goes first in line, and takes the room
    (second,) = admission.choose([worst_case(two)])
    assert (second.request.id, second.index) == ("two", 1)
    assert admission.choose([worst_case(two)] * 2) == []  # "late" waits for memory


def test_a_request_that_could_never_fit_is_refused_with_the_limit_and_a_default_shrinks() -> None:
    import pytest

    from cluster.serve.requests import RequestError, _fit_budget

    assert _fit_budget({}, 36, 900, 1, 2306) == 900
    with pytest.raises(RequestError, match="budget of 1024 tokens") as caught:
        _fit_budget({}, 36, 1500, 1, 2306)
    assert caught.value.code == "kv_budget_exceeded"
    with pytest.raises(RequestError, match="512 tokens of KV cache for each of its n=2"):
        _fit_budget({}, 36, 600, 2, 2306)
    assert _fit_budget({"max_tokens_default": True}, 36, 2012, 1, 2306) == 1024 - 36
    with pytest.raises(RequestError, match="shorten the prompt"):
        _fit_budget({}, 1024, 1, 1, 2306)
    assert _fit_budget({}, 36, 10**6, 1, None) == 10**6  # no budget known: not bounded
