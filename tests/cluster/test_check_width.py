"""The draft width chosen from step costs and acceptance (cluster/speculative/check_width.py), on
recorded figures, and the width's trip in the step message."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cluster.serve.control import Step
from cluster.speculative.check_width import (
    MARGIN,
    Prospect,
    StepCost,
    StepCosts,
    choose_width,
    expected_accepted,
    learning_pays,
)

# A CPU's forward is compute-bound and grows with every position: the fit serve's rank 0 made
# here (OpenBLAS, 2 cores) for the real SmolLM2 float32 on one rank, 1-client chats. And a
# Mac-like forward (memory-bound: reading the weights dominates, a position costs little).
CPU = StepCost(0.053, 0.017, 0.004)
# The same model and machine at 7-8 rows (chats at 8 clients): a row costs far less in a batch.
CPU_BATCH = StepCost(0.060, 0.0045, 0.004)
MAC = StepCost(0.030, 0.00004, 0.001)


def test_the_fit_recovers_a_line_from_noisy_steps() -> None:
    rng = random.Random(7)
    costs = StepCosts()
    for _ in range(200):
        positions = rng.choice([1, 3, 8, 9, 16])
        costs.record(positions, (0.02 + 0.003 * positions) * rng.uniform(0.95, 1.05))
    fit = costs.fit()
    assert fit is not None and fit.check_s == 0.0  # no check measured
    assert fit.fixed_s == pytest.approx(0.02, rel=0.15)
    assert fit.per_position_s == pytest.approx(0.003, rel=0.1)


def test_what_a_check_adds_is_fitted_apart() -> None:
    """Plain steps of one row only (one client) and checks of several widths: the slope comes
    from the checks, the plain intercept from the plain steps, and checking's own cost apart."""
    costs = StepCosts()
    for _ in range(6):
        costs.record(1, 0.060)
        for positions in (3, 5, 9):
            costs.record(positions, 0.056 + 0.004 * positions + 0.010, checked=True)
    fit = costs.fit()
    assert fit is not None
    assert fit.per_position_s == pytest.approx(0.004)
    assert fit.fixed_s == pytest.approx(0.056)
    assert fit.check_s == pytest.approx(0.010)
    assert fit.seconds(1, False) == pytest.approx(0.060)


def test_no_fit_until_two_position_counts_are_measured_enough() -> None:
    costs = StepCosts()
    for _ in range(10):
        costs.record(8, 0.05)
    costs.record(16, 0.09)
    assert costs.fit() is None  # one step at 16 positions says little
    costs.record(16, 0.09)
    costs.record(16, 0.09)
    fit = costs.fit()
    assert fit is not None and fit.per_position_s == pytest.approx(0.005)


def test_a_forward_never_gets_cheaper_with_width() -> None:
    costs = StepCosts()
    for _ in range(5):
        costs.record(1, 0.030)
        costs.record(2, 0.029)  # noise
    fit = costs.fit()
    assert fit is not None
    assert (fit.fixed_s, fit.per_position_s, fit.check_s, fit.measured_positions) == (
        pytest.approx(0.0295),
        0.0,
        0.0,
        2,
    )


def test_nothing_to_copy_means_plain_steps() -> None:
    nothing = [Prospect(rate=0.0, limit=8, found=0.0)] * 8
    assert choose_width(CPU, nothing, rows=8) == 0
    assert choose_width(MAC, nothing, rows=8) == 0
    paused = [Prospect(rate=0.9, limit=0, found=1.0)]  # a paused sequence drafts nothing
    assert choose_width(MAC, paused, rows=1) == 0


def test_a_memory_bound_forward_checks_long_drafts_that_hold() -> None:
    holding = [Prospect(rate=0.9, limit=8, found=1.0)]
    assert choose_width(MAC, holding, rows=1) == 8
    assert choose_width(MAC, holding * 8, rows=8) == 8


def test_a_compute_bound_batch_checks_less_as_rows_grow() -> None:
    """On the CPU every position costs: one sequence with good drafts checks several tokens, a
    batch of 8 with middling drafts checks none (the fixed bound of 16 positions checked one
    each: 1.7x a plain step's time for 1.2x its tokens)."""
    good = Prospect(rate=0.8, limit=8, found=1.0)
    middling = Prospect(rate=0.4, limit=8, found=0.5)
    alone = choose_width(CPU_BATCH, [good], rows=1)
    assert alone >= 3
    assert choose_width(CPU_BATCH, [middling] * 8, rows=8) == 0
    assert 0 < choose_width(CPU_BATCH, [good] * 8, rows=8) < alone
    # where every position costs a third of a step, what a check of 8 rows gains is within
    # the margin a check must promise: plain steps
    assert choose_width(CPU, [good] * 8, rows=8) == 0


def test_checks_measured_widely_get_a_line_of_their_own() -> None:
    """Packed checks of SmolLM2 on the CPU, 8 rows of long contexts: a position a check adds
    costs far more than a plain step's row (it attends over the whole context through the
    general kernel), so one slope through both made a plain step of 8 rows look 18 % dearer
    than it was and checks that lost look as if they paid. Plain steps at a measured row count
    are priced by their own mean."""
    costs = StepCosts()
    for _ in range(5):
        costs.record(8, 0.125)
        costs.record(2, 0.087)
        for positions in (10, 14, 18, 22):
            costs.record(positions, 0.055 + 0.0155 * positions, checked=True)
    fit = costs.fit()
    assert fit is not None
    assert fit.check_slope == pytest.approx(0.0155)
    assert fit.seconds(8, False) == pytest.approx(0.125)
    assert fit.seconds(16, True) == pytest.approx(0.055 + 0.0155 * 16)
    edit = Prospect(rate=0.99, limit=8, found=1.0)
    chat = Prospect(rate=0.5, limit=2, found=0.05)
    # four edits and four chats at 8 rows: 8 + ~27 tokens for ~0.6 s do not beat 8 in 0.125 s
    # (the one slope said 0.147 s, and chose 7)
    assert choose_width(fit, [edit] * 4 + [chat] * 4, rows=8, packed=True) == 0
    # one edit alone: a check of 9 positions (0.195 s, ~6 tokens) beats a plain step
    costs.record(1, 0.07)
    costs.record(1, 0.07)
    costs.record(1, 0.07)
    assert choose_width(costs.fit() or fit, [edit], rows=1, packed=True) >= 4


def test_a_check_that_packs_pays_for_the_rows_that_draft_only() -> None:
    """Four edits with drafts that hold and four chats with nothing to copy, on the CPU: padded,
    every chat pays for the edits' width, and plain steps win; packed, a chat costs its one
    position and the edits check wide."""
    edit = Prospect(rate=0.9, limit=8, found=1.0)
    chat = Prospect(rate=0.5, limit=2, found=0.0)
    mixed = [edit] * 4 + [chat] * 4
    assert choose_width(CPU_BATCH, mixed, rows=8) <= 1
    assert choose_width(CPU_BATCH, mixed, rows=8, packed=True) >= 4
    # with nothing to copy anywhere, packing changes nothing: plain steps
    assert choose_width(CPU_BATCH, [chat] * 8, rows=8, packed=True) == 0
    # a packed check is priced by the positions it computes: a width past every sequence's own
    # limit adds nothing, so the narrower of equal widths is kept
    short = Prospect(rate=0.9, limit=3, found=1.0)
    assert choose_width(MAC, [short] * 8, rows=8, packed=True) == 3


def test_a_newcomer_is_asked_only_where_its_drafts_could_pay() -> None:
    """Learning a fresh sequence's worth costs checks; they are made only where some width would
    pay were its drafts found and taken whole. Measured here (8 rows of SmolLM2 on the CPU): a
    check of one token a row took 154 ms against a plain step's 96."""
    cpu_8_rows = StepCost(0.087, 0.0012, 0.05, measured_positions=16)
    settled = Prospect(rate=0.3, limit=8, found=0.4)
    newcomer = Prospect(rate=0.5, limit=8, found=0.5, fresh=True)
    assert not learning_pays(cpu_8_rows, [newcomer] + [settled] * 7, rows=8)
    assert learning_pays(cpu_8_rows, [newcomer] * 8, rows=8)  # all new at once: worth asking
    assert learning_pays(cpu_8_rows, [newcomer], rows=1)  # alone a check is cheap
    assert learning_pays(MAC, [newcomer] + [settled] * 7, rows=8)  # memory-bound: cheap too
    paused = replace(newcomer, limit=0)
    assert not learning_pays(cpu_8_rows, [paused] + [settled] * 7, rows=8)


def test_the_chosen_width_is_the_best_of_all() -> None:
    """Brute force over every width on random prospects and costs: nothing beats the choice
    (plain steps with the margin a check must beat them by)."""
    rng = random.Random(3)
    for _ in range(300):
        cost = StepCost(rng.uniform(0.001, 0.05), rng.uniform(0.0, 0.004), rng.uniform(0, 0.01))
        rows = rng.randint(1, 16)
        ps = [Prospect(rng.random(), rng.randint(0, 8), rng.random()) for _ in range(rows)]
        best = choose_width(cost, ps, rows)
        drafting = 1.0
        for p in ps:
            drafting *= 1 - (p.found if p.limit else 0.0)
        plain = cost.seconds(rows, False)
        rates = [rows / plain] + [
            (rows + sum(expected_accepted(p, w) for p in ps))
            / ((1 - drafting) * cost.seconds(rows * (w + 1), True) + drafting * plain)
            for w in range(1, 9)
        ]
        rates[0] *= 1 + MARGIN  # a check must promise this much more than plain steps
        assert all(rates[best] >= r * (1 - 1e-9) for r in rates)


def test_expected_accepted_counts_only_unbroken_runs() -> None:
    p = Prospect(rate=0.5, limit=3, found=1.0)
    assert expected_accepted(p, 8) == pytest.approx(0.5 + 0.25 + 0.125)  # limit 3
    assert expected_accepted(Prospect(0.5, 8, 0.5), 1) == pytest.approx(0.25)


@pytest.mark.parametrize("width", [None, 0, 5])
def test_the_width_travels_in_the_step_message(width: int | None) -> None:
    step = Step(steps=4, draft_width=width)
    assert Step.decode(step.encode()) == step


def _serve_like(
    model: Any, tokenizer: Any, prompts: list[list[int]], speculative: bool
) -> tuple[list[list[int]], list[bool], list[int], int | None]:
    """The batch engine on a real model, driven as the serve loop drives it (rank 0's width at
    each decision, leases of 4 steps): each prompt's tokens, whether each decode step checked
    drafts, the tokens each decode step gave, and the last width sent."""
    from mlx_lm.generate import generation_stream

    from cluster.serve.control import Admit
    from cluster.serve.engine import Engine

    engine = Engine(model, tokenizer, generation_stream, 8, 0, speculative)
    adds = [Admit(ids=p, max_tokens=160) for p in prompts]
    uids = engine.apply(Step(steps=4, add=adds))
    out: dict[int | str, list[int]] = {u: [] for u in uids}
    checked: list[bool] = []
    given: list[int] = []
    while not engine.idle:
        width = engine.check_width()  # what rank 0's scheduler sends at each decision
        if width is not None and width != engine.width:
            engine.apply(Step(steps=4, draft_width=width))
        for _ in range(4):  # a lease
            started = time.monotonic()
            prompt_responses, responses = engine.next()
            if responses and not prompt_responses:
                engine.measured(time.monotonic() - started)
                batch = engine._batch
                checked.append(bool(batch is not None and batch.checked))
                given.append(len(responses))
            for r in responses:
                out[r.uid].append(r.token)
            if engine.idle:
                break
    return [out[u] for u in uids], checked, given, engine.width


def test_drafts_that_never_hold_soon_stop_costing(
    tiny: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every sequence always has a draft and the draft is always wrong: the drafts are checked
    at first, then the sequences pause (doubling) and the batch takes plain steps, with only
    rare checks after; the widths come from rank 0's measured costs. The tokens are plain
    steps' throughout."""
    from mlx_lm import load

    from cluster.speculative.lookup import PromptLookup

    model, tokenizer = load(str(tiny("llama")))
    prompts = [[5, 17, 42, 8, 99, 3], [11, 12, 13], [40, 41, 7, 9, 30], [70, 2, 8]]
    plain, _, _, _ = _serve_like(model, tokenizer, prompts, False)
    monkeypatch.setattr(PromptLookup, "may_match", lambda self, history: True)
    monkeypatch.setattr(
        PromptLookup,
        "propose",
        lambda self, history, pending, limit: [(pending + 1) % 1000] * limit,
    )
    drafted, checked, _, width = _serve_like(model, tokenizer, prompts, True)
    assert drafted == plain
    assert width is not None, "the costs were measured: rank 0 chose the widths"
    early, late = checked[: len(checked) // 4], checked[len(checked) // 4 :]
    assert any(early), "the drafts were checked at first"
    assert sum(late) <= 6, f"{sum(late)} checking forwards of {len(late)} steps"


def test_a_sequence_whose_drafts_start_to_hold_after_a_pause_is_checked_again(
    tiny: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edit's preamble copies nothing, then the code does: the first drafts are wrong (the
    sequence pauses), the later ones are the answer itself. With the width from the measured
    costs alone, the pause ends though the batch checks nothing meanwhile, the sequence is asked
    again, and most of its later tokens come from drafts; the text is plain steps'. (With the
    pause counted only when the batch asked, the last 80 steps here gave one token each.)"""
    from mlx_lm import load

    from cluster.speculative.lookup import PromptLookup

    model, tokenizer = load(str(tiny("llama")))
    prompt = [5, 17, 42, 8, 99, 3]
    ((answer,), _, _, _) = _serve_like(model, tokenizer, [prompt], False)
    asked = [0]

    def propose(self: Any, history: list[int], pending: int, limit: int) -> list[int]:
        asked[0] += 1
        at = len(history) - len(prompt)  # answer tokens fed before `pending`
        true = answer[at + 1 : at + 1 + limit]
        return [(t + 1) % 300 for t in true] if asked[0] <= 4 else true

    monkeypatch.setattr(PromptLookup, "may_match", lambda self, history: True)
    monkeypatch.setattr(PromptLookup, "propose", propose)
    (drafted,), _, given, width = _serve_like(model, tokenizer, [prompt], True)
    assert drafted == answer
    assert width is not None, "the costs were measured: rank 0 chose the widths"
    late = given[len(given) // 2 :]
    assert sum(late) >= 2 * len(late), f"{sum(late)} tokens in the last {len(late)} steps"


def test_a_new_sequence_starts_from_what_finished_ones_were_worth() -> None:
    """Nothing to copy in the last requests: the next one is not assumed to draft well (the
    hopeful start made every new chat of a 16-client run check drafts for nothing)."""
    from cluster.speculative.drafts import Drafts

    drafts = Drafts()
    drafts.expect(1, None)
    drafts.join(1, [1, 2, 3])
    first = drafts.prospect(1)
    assert first is not None and first.found == 1.0
    for step in range(12):  # asked every step, never a draft
        assert drafts.propose(1, [1, 2, 3, *range(100, 101 + step)], 99) == []
    drafts.forget(1)
    drafts.expect(2, None)
    drafts.join(2, [4, 5, 6])
    second = drafts.prospect(2)
    assert second is not None and second.found < 0.6


def test_a_prediction_is_not_judged_by_the_chats_before_it() -> None:
    """Chats with nothing to copy lower what the next chat is assumed worth, not what a request
    with a prediction (the client's claim of the answer) is: that has a prior of its own."""
    from cluster.speculative.drafts import Drafts

    drafts = Drafts()
    for uid in range(3):
        drafts.expect(uid, None)
        drafts.join(uid, [1, 2, 3])
        for step in range(12):
            assert drafts.propose(uid, [1, 2, 3, *range(100, 101 + step)], 99) == []
        drafts.forget(uid)
    drafts.expect(7, [5, 6, 7, 8])
    drafts.join(7, [1, 2, 3])
    predicted = drafts.prospect(7)
    assert predicted is not None and predicted.found == 1.0 and predicted.rate >= 0.8


def test_a_new_sequence_is_asked_a_few_times_whatever_came_before() -> None:
    """What the chats before it found says little about an edit: a new sequence stays `fresh`
    (the engine then checks at least FIRST_DRAFT tokens) until it was asked FRESH_ASKS times."""
    from cluster.speculative.drafts import FRESH_ASKS, Drafts

    drafts = Drafts()
    drafts.expect(1, None)
    drafts.join(1, [1, 2, 3])
    history = [1, 2, 3]
    for step in range(FRESH_ASKS):
        prospect = drafts.prospect(1)
        assert prospect is not None and prospect.fresh, step
        history.append(100 + step)
        drafts.wants(1, history)
    prospect = drafts.prospect(1)
    assert prospect is not None and not prospect.fresh


def test_a_sequence_that_could_copy_is_seen_while_the_batch_does_not_draft() -> None:
    """`observe` runs every step without waiting for the step in flight: a sequence whose tail
    keeps recurring (code being copied back) keeps its chance of a draft up, one with fresh
    text brings it down, though neither was asked."""
    from cluster.speculative.drafts import Drafts

    drafts = Drafts()
    code = list(range(10, 40))
    for uid, tail in ((1, code), (2, list(range(500, 530)))):
        drafts.expect(uid, None)
        drafts.join(uid, code)
        history = list(code)
        for token in tail:
            history.append(token)
            drafts.observe(uid, history)
    copying, fresh = drafts.prospect(1), drafts.prospect(2)
    assert copying is not None and fresh is not None
    assert copying.found > 0.9 and fresh.found < 0.1


def test_one_rejected_token_mid_copy_leaves_a_copying_sequence_worth_asking() -> None:
    """A sequence's worth is the chance a drafted token holds (held / (held + cut checks), recent
    checks weighing more), at the most it could draft: its own length, cut to 1 by a rejection
    and regrown by doubling, does not make the batch stop asking (a fresh edit ran at 1.1x
    `--speculative off` while worth followed the length, 2.8x with a fixed width)."""
    from cluster.speculative.drafts import Drafts

    drafts = Drafts()
    drafts.expect(1, None)
    drafts.join(1, [1, 2, 3])
    for drafted, accepted in [(2, 2), (4, 4), (8, 8), (8, 8), (8, 0)]:  # the renamed parameter
        drafts.record(1, drafted, accepted)
    copying = drafts.prospect(1)
    assert copying is not None and copying.limit == 8 and copying.rate > 0.8
    assert choose_width(CPU, [copying], rows=1) >= 3
    for _ in range(8):  # then nothing holds any more: its worth falls with it
        drafts.record(1, 1, 0)
    stopped = drafts.prospect(1)
    assert stopped is not None and stopped.rate < 0.2
    assert choose_width(CPU, [replace(stopped, limit=8)], rows=1) == 0  # paused or not


def test_a_pause_counts_steps_while_the_batch_checks_nothing() -> None:
    """A paused sequence is worth nothing to the width, so while every sequence pauses the batch
    takes plain steps: the pause must count those steps (observe(), every step), or it would
    never end and the batch would never check again (a fresh edit ran at `--speculative off`'s
    speed so)."""
    from cluster.speculative.draft_length import FIRST_PAUSE
    from cluster.speculative.drafts import Drafts

    drafts = Drafts()
    drafts.expect(1, None)
    drafts.join(1, [1, 2, 3])
    drafts.record(1, 2, 0)  # rejected: paused
    history = [1, 2, 3]
    for step in range(FIRST_PAUSE):
        history.append(100 + step)
        drafts.observe(1, history)
        paused = drafts.prospect(1)
        assert paused is not None and paused.limit == 0, step
    drafts.observe(1, [*history, 200])
    back = drafts.prospect(1)
    assert back is not None and back.limit == 8


def test_checks_at_one_width_give_no_slope_of_their_own() -> None:
    """Plain steps at 7 and 8 rows (noise: 8 came out cheaper) and checks at one position count:
    one line through all of them, so a wider check is dearer (with an intercept of their own,
    every width would cost the same)."""
    costs = StepCosts()
    for _ in range(5):
        costs.record(7, 0.095)
        costs.record(8, 0.092)
        costs.record(28, 0.190, checked=True)
    fit = costs.fit()
    assert fit is not None and fit.check_s == 0.0
    assert fit.per_position_s > 0.003
    assert fit.seconds(64, True) > 1.5 * fit.seconds(28, True)


def test_checks_widen_at_most_to_twice_what_was_measured() -> None:
    """A line fitted on plain steps says nothing of a check 9 times as wide: at 8 rows with
    only plain steps measured, a check reads at most 16 positions (one drafted token a row)."""
    flat = StepCost(0.090, 0.0, 0.0, measured_positions=8)
    holding = [Prospect(rate=0.9, limit=8, found=1.0)] * 8
    assert choose_width(flat, holding, rows=8) == 1
    assert choose_width(replace(flat, measured_positions=32), holding, rows=8) == 7
