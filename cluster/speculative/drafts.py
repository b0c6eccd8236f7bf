"""Every running sequence's draft sources, draft length and counts, by uid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.speculative.draft_length import DraftLength
from cluster.speculative.lookup import Prediction, PromptLookup


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


class Drafts:
    """Registered when a request is inserted (`expect`), joined when its prompt is read
    (`join`); before each step `wants` (from the tokens fed so far: no wait for the step in
    flight), then `propose` with the token fed next, and `record` of the outcome."""

    def __init__(self) -> None:
        self._waiting: dict[int, Sequence[int] | None] = {}
        self._running: dict[int, _Sequence] = {}

    def expect(self, uid: int, prediction: Sequence[int] | None) -> None:
        self._waiting[uid] = prediction

    def join(self, uid: int, tokens: list[int]) -> None:
        """The sequence starts decoding after its prompt `tokens`."""
        if uid not in self._waiting:
            return
        prediction = self._waiting.pop(uid)
        self._running[uid] = _Sequence(
            lookup=PromptLookup(),
            prediction=Prediction(prediction) if prediction else None,
            prompt_len=len(tokens),
        )

    def wants(self, uid: int, history: list[int]) -> bool:
        """Whether the sequence may draft this step (once per step: pauses count steps)."""
        s = self._running.get(uid)
        if s is None or not s.length.ready():
            return False
        return s.prediction is not None or s.lookup.may_match(history)

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
        return draft

    def record(self, uid: int, drafted: int, accepted: int) -> None:
        s = self._running.get(uid)
        if s is None or drafted == 0:
            return
        s.length.record(drafted, accepted)
        c = s.counts
        c.drafted, c.accepted, c.checks = c.drafted + drafted, c.accepted + accepted, c.checks + 1
        if s.from_prediction:
            c.prediction_accepted += accepted
            c.prediction_rejected += drafted - accepted

    def forget(self, uid: int) -> DraftCounts | None:
        self._waiting.pop(uid, None)
        s = self._running.pop(uid, None)
        return None if s is None else s.counts

    def counts(self, uid: int) -> DraftCounts | None:
        s = self._running.get(uid)
        return None if s is None else s.counts
