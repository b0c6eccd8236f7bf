"""Every running sequence's draft sources, draft length and counts, by uid."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cluster.speculative.check_width import Prospect
from cluster.speculative.draft_length import MAX_DRAFT, DraftLength
from cluster.speculative.draft_model import ModelDrafter
from cluster.speculative.lookup import Prediction, PromptLookup

FOUND_WEIGHT = 0.25  # of the newest step in a sequence's running share of steps with a draft
# What a new sequence is assumed to be worth until it drafts: what finished ones with the same
# kind of source were lately (this weight per finished sequence); before any finished, hopeful:
# every step has a draft, and a client's prediction is mostly right (it says it is the answer).
PRIOR_WEIGHT = 0.5
# (found, per-token acceptance q: the chance a drafted token holds given the one before did)
FIRST_PRIORS = {"lookup": (1.0, 0.5), "prediction": (1.0, 0.8)}
# A sequence's q is counted over its recent checks: each weighs this much less at every newer
# one (the text it writes changes: a copied function, then prose about it).
KEEP = 0.7
MAX_Q = 0.95  # a prior is never certainty: a sequence's own misses must be able to count
# A new sequence is asked for drafts this many times whatever the costs say: what it is worth
# is learnt only by asking (an edit after chats copies a lot, though the chats found nothing).
FRESH_ASKS = 4


@dataclass
class DraftCounts:
    """What a sequence drafted and what of it was accepted (usage and /metrics)."""

    drafted: int = 0
    accepted: int = 0
    checks: int = 0  # forwards that checked at least one of its drafted tokens
    prediction_accepted: int = 0  # of the drafted tokens that came from the client's prediction
    prediction_rejected: int = 0


@dataclass
class _Sequence:
    lookup: PromptLookup
    prediction: Prediction | None
    prompt_len: int
    length: DraftLength = field(default_factory=DraftLength)
    counts: DraftCounts = field(default_factory=DraftCounts)
    answer_seen: int = 0  # answer tokens (the pending one included) given to the prediction
    from_prediction: bool = False  # where the draft being checked came from
    # Running shares: of steps where a draft could match at all (seen every step, no waiting),
    # and of those where asking then found one (seen only when asked; hopeful start).
    could: float = 1.0
    found: float = 1.0
    asks: int = 0
    seen: tuple[int, bool] = (-1, False)  # (tokens, could it draft then): observe()'s answer
    ready: bool = True  # not pausing this step (observe() counts a pause down every step)
    # Drafted tokens kept and checks cut short (a token rejected), recent ones weighing more,
    # from the prior's pseudo-counts: q = held / (held + cuts), a run length's geometric law.
    held: float = 1.0
    cuts: float = 1.0
    cut_checks: int = 0  # checks that rejected a token, over the whole sequence (for priors)

    def asked(self, had_draft: bool) -> None:
        self.found = (1 - FOUND_WEIGHT) * self.found + FOUND_WEIGHT * had_draft


# Rank 0's drafts of a step on every rank (None from the others): set with a draft model,
# whose drafts only rank 0 can make. Called at the same steps on every rank.
Exchange = Callable[[list[list[int]] | None], list[list[int]]]


class Drafts:
    """Registered when a request is inserted (`expect`), joined when its prompt is read
    (`join`); before each step `wants` (from the tokens fed so far: no wait for the step in
    flight), then `propose` with the token fed next, and `record` of the outcome.

    With a draft model (`model_drafts`), a sequence with nothing to copy drafts from the model;
    rank 0 (`drafter` set) proposes every draft and `exchange` hands them to the other ranks."""

    def __init__(
        self,
        drafter: ModelDrafter | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        self._waiting: dict[int, Sequence[int] | None] = {}
        self._running: dict[int, _Sequence] = {}
        self.drafter, self.exchange = drafter, exchange
        self.model_drafts = exchange is not None  # the same on every rank, drafter or not
        # source -> (found, q)
        self._priors: dict[str, tuple[float, float]] = dict(FIRST_PRIORS)

    def expect(self, uid: int, prediction: Sequence[int] | None) -> None:
        self._waiting[uid] = prediction

    def join(self, uid: int, tokens: list[int]) -> None:
        """The sequence starts decoding after its prompt `tokens`."""
        if uid not in self._waiting:
            return
        given = self._waiting.pop(uid)
        prediction = Prediction(given) if given else None
        found, q = self._priors[_source(prediction)]
        q = min(q, MAX_Q)
        self._running[uid] = _Sequence(
            lookup=PromptLookup(),
            prediction=prediction,
            prompt_len=len(tokens),
            found=found,
            held=q / (1 - q),  # one cut's worth of prior at the prior's q
        )

    def _could(self, s: _Sequence, history: list[int]) -> bool:
        return self.model_drafts or s.prediction is not None or s.lookup.may_match(history)

    def observe(self, uid: int, history: list[int]) -> None:
        """Every step, drafting or not: whether a draft could match now (cheap, no wait for the
        step in flight), so a sequence that could copy is seen even while the batch does not
        draft."""
        s = self._running.get(uid)
        if s is not None:
            # A pause counts steps, drafting or not: were it counted only when the batch asks,
            # a batch that checks nothing while every sequence pauses would wait for ever.
            s.ready = s.length.ready()
            s.seen = (len(history), self._could(s, history))
            s.could = (1 - FOUND_WEIGHT) * s.could + FOUND_WEIGHT * s.seen[1]

    def wants(self, uid: int, history: list[int]) -> bool:
        """Whether the sequence may draft this step (after observe() of the same step)."""
        s = self._running.get(uid)
        if s is None or not s.ready:
            return False
        s.asks += 1
        seen, could = s.seen
        # observe() looked at these same tokens this step: no second lookup
        return could if seen == len(history) else self._could(s, history)

    def propose(self, uid: int, history: list[int], pending: int) -> list[int]:
        """The draft to check after `pending` (the token fed next), given the tokens fed so far."""
        s = self._running[uid]
        limit = s.length.limit
        draft: list[int] = []
        if s.prediction is not None:
            answer = [*history[s.prompt_len :], pending]
            draft = s.prediction.propose(answer[s.answer_seen :], limit)
            s.answer_seen = len(answer)
        s.from_prediction = bool(draft)
        if not draft:
            draft = s.lookup.propose(history, pending, limit)
        if not draft and self.drafter is not None:
            draft = self.drafter.propose(uid, history, pending, limit)
        s.asked(bool(draft))
        return draft

    def prospect(self, uid: int) -> Prospect | None:
        """What the sequence's drafts are worth now (check_width.py); None when it is not
        decoding."""
        s = self._running.get(uid)
        if s is None:
            return None
        # Valued at what it can draft, not at its momentary length (draft_length.py cuts that
        # to 1 after a rejection and regrows it by doubling): one rejected token mid-copy must
        # not make the batch stop asking a sequence that copies.
        limit = MAX_DRAFT if s.ready else 0
        q = s.held / (s.held + s.cuts)
        found = s.could * s.found
        return Prospect(rate=q, limit=limit, found=found, fresh=s.asks < FRESH_ASKS)

    def record(self, uid: int, drafted: int, accepted: int) -> None:
        s = self._running.get(uid)
        if s is None or drafted == 0:
            return
        s.length.record(drafted, accepted)
        cut = accepted < drafted
        s.held = KEEP * s.held + accepted
        s.cuts = KEEP * s.cuts + cut
        s.cut_checks += cut
        c = s.counts
        c.drafted, c.accepted, c.checks = c.drafted + drafted, c.accepted + accepted, c.checks + 1
        if s.from_prediction:
            c.prediction_accepted += accepted
            c.prediction_rejected += drafted - accepted

    def forget(self, uid: int) -> DraftCounts | None:
        self._waiting.pop(uid, None)
        if self.drafter is not None:
            self.drafter.forget(uid)
        s = self._running.pop(uid, None)
        if s is None:
            return None
        source = _source(s.prediction)
        found, q = self._priors[source]
        found += PRIOR_WEIGHT * (s.found - found)
        if s.counts.drafted:
            kept = s.counts.accepted / (s.counts.accepted + max(s.cut_checks, 1))
            q += PRIOR_WEIGHT * (kept - q)
        self._priors[source] = (found, q)
        return s.counts

    def counts(self, uid: int) -> DraftCounts | None:
        s = self._running.get(uid)
        return None if s is None else s.counts


def _source(prediction: object) -> str:
    """The kind of draft source a sequence has first: the client's prediction or lookup."""
    return "lookup" if prediction is None else "prediction"
