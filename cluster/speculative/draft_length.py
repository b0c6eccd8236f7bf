"""How many tokens a sequence drafts next, from its own recent acceptance: longer while drafts
are taken whole, shorter when they are cut, none for a while when they keep missing (a missed
draft costs a wider forward for nothing). Deterministic, so every rank agrees."""

from __future__ import annotations

from dataclasses import dataclass

MAX_DRAFT = 8  # tokens checked per forward at most; the forward's cost grows with it
FIRST_DRAFT = 4
MISSES_BEFORE_PAUSE = 2  # drafts in a row with nothing accepted
FIRST_PAUSE = 4  # steps without drafting after that; doubles up to MAX_PAUSE
MAX_PAUSE = 64


@dataclass
class DraftLength:
    limit: int = FIRST_DRAFT
    misses: int = 0
    paused: int = 0  # steps left without drafting
    pause: int = FIRST_PAUSE

    def allowed(self) -> int:
        """The most tokens to draft this step (0: skip drafting)."""
        if self.paused > 0:
            self.paused -= 1
            return 0
        return self.limit

    def record(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if accepted == drafted:
            self.limit = min(MAX_DRAFT, self.limit + 2)
        else:
            self.limit = max(1, min(self.limit, accepted + 1))
        if accepted == 0:
            self.misses += 1
            if self.misses >= MISSES_BEFORE_PAUSE:
                self.paused, self.pause = self.pause, min(MAX_PAUSE, self.pause * 2)
                self.misses = 0
        else:
            self.misses, self.pause = 0, FIRST_PAUSE
