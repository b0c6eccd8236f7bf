"""Every running sequence's draft sources, draft length and counts, by uid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

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

    def add(self, other: DraftCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class _Sequence:
    lookup: PromptLookup | None
    prediction: Prediction | None
    length: DraftLength = field(default_factory=DraftLength)
    counts: DraftCounts = field(default_factory=DraftCounts)
    prompt_len: int = 0
    seen: int = 0  # tokens of the sequence already given to the sources
    from_prediction: bool = False  # where the pending draft came from


class Drafts:
    """Registered when a request is inserted (`expect`), joined when its prompt is read
    (`join`), asked for a draft before each step (`propose`), told the outcome (`record`)."""

    def __init__(self, lookup: bool) -> None:
        self.lookup = lookup  # prompt lookup for every sequence (off: predictions only)
        self._waiting: dict[int, Sequence[int] | None] = {}
        self._running: dict[int, _Sequence] = {}
        self.finished: dict[int, DraftCounts] = {}  # until the caller takes them

    def expect(self, uid: int, prediction: Sequence[int] | None) -> None:
        self._waiting[uid] = prediction

    def join(self, uid: int, tokens: list[int]) -> None:
        """The sequence starts decoding; `tokens` (its prompt, grown in place) is its history."""
        if uid not in self._waiting:
            return
        prediction = self._waiting.pop(uid)
        self._running[uid] = _Sequence(
            lookup=PromptLookup(()) if self.lookup else None,
            prediction=Prediction(prediction) if prediction else None,
            prompt_len=len(tokens),
        )

    def propose(self, uid: int, history: list[int], pending: int) -> list[int]:
        """The draft to check after `pending` (the token fed next), given the tokens fed so far."""
        s = self._running.get(uid)
        if s is None:
            return []
        new = [*history[s.seen :], pending]
        answer_new = new[max(0, s.prompt_len - s.seen) :]
        s.seen = len(history) + 1
        if s.lookup is not None:
            s.lookup.index.tokens.extend(new)
        limit = s.length.allowed()
        draft = s.prediction.propose(answer_new, limit) if s.prediction is not None else []
        s.from_prediction = bool(draft)
        if not draft and s.lookup is not None and limit:
            draft = s.lookup.propose((), limit)
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
