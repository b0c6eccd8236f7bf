"""How many tokens a sequence drafts next, from its own recent acceptance: longer while drafts
are taken whole, shorter when they are cut, and none for a while (doubling each time) when its
drafts are mostly rejected — a rejected draft costs a wider forward for nothing. Only token
outcomes decide, never timings, so every rank makes the same decisions."""

from __future__ import annotations

from dataclasses import dataclass

MAX_DRAFT = 8  # tokens checked per forward at most; the forward's cost grows with it
FIRST_DRAFT = 2  # cheap to be wrong; doubles to MAX_DRAFT in a few checks when drafts hold
PAUSE_BELOW = 0.35  # recent accepted/drafted below this: stop drafting for a while
FIRST_PAUSE = 4  # steps without drafting; doubles (up to MAX_PAUSE) until drafts pay again
MAX_PAUSE = 128
WEIGHT = 0.5  # of the newest check in the running acceptance rate


@dataclass
class DraftLength:
    limit: int = FIRST_DRAFT
    rate: float = 0.5  # running accepted/drafted
    paused: int = 0  # steps left without drafting
    pause: int = FIRST_PAUSE

    def ready(self) -> bool:
        """Whether to draft this step (called once per step: a pause counts steps)."""
        if self.paused > 0:
            self.paused -= 1
            return False
        return True

    def record(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.rate = (1 - WEIGHT) * self.rate + WEIGHT * accepted / drafted
        if accepted == drafted:
            self.limit = min(MAX_DRAFT, self.limit * 2)
        else:
            self.limit = max(1, min(self.limit, accepted + 1))
        if self.rate < PAUSE_BELOW:
            self.paused, self.pause = self.pause, min(MAX_PAUSE, self.pause * 2)
            self.rate, self.limit = 0.5, FIRST_DRAFT  # a fresh start after the pause
        elif self.rate >= 2 * PAUSE_BELOW:
            self.pause = FIRST_PAUSE
