"""How many drafted tokens the batch checks per forward: the width that gives the most tokens per
second of step time, from what forwards cost on these ranks (measured as they run, no separate
calibration) and what each sequence's drafts have recently been worth.

Every row of a checking forward pays for the longest draft, so the choice is one width for the
batch: each sequence drafts up to it (and up to its own limit, draft_length.py). A step of `rows`
rows at width W reads rows × (W + 1) positions and costs `cost(rows × (W + 1))`; it emits one
token per row plus the drafted tokens accepted. Width 0 is the plain step. Rank 0 chooses, and
the step message carries the width (serve/control.py), so every rank drafts alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.speculative.draft_length import MAX_DRAFT

WEIGHT = 0.2  # of a new step time in its position count's running mean
MIN_STEPS = 3  # steps at a position count before its mean counts in the fit
FIT_WEIGHT_CAP = 16  # a point's weight in the fit grows with its steps up to this


@dataclass
class StepCosts:
    """Decode steps' wall times by the positions their forward read (rows × (width + 1))."""

    means: dict[int, float] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)

    def record(self, positions: int, seconds: float) -> None:
        if positions <= 0 or seconds <= 0:
            return
        n = self.steps.get(positions, 0)
        mean = self.means.get(positions, seconds)
        # The plain mean while a count is new, then a running one: the cost follows the load.
        w = max(WEIGHT, 1 / (n + 1))
        self.means[positions] = (1 - w) * mean + w * seconds
        self.steps[positions] = n + 1

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per position) by weighted least squares over the position
        counts measured MIN_STEPS times or more; None until two such counts exist."""
        points = [(p, m, min(self.steps[p], FIT_WEIGHT_CAP)) for p, m in self.means.items()]
        points = [pt for pt in points if self.steps[pt[0]] >= MIN_STEPS]
        if len({p for p, _, _ in points}) < 2:
            return None
        total = sum(w for _, _, w in points)
        mx = sum(w * p for p, _, w in points) / total
        my = sum(w * m for _, m, w in points) / total
        sxx = sum(w * (p - mx) ** 2 for p, _, w in points)
        sxy = sum(w * (p - mx) * (m - my) for p, m, w in points)
        # Noise can tilt two close points either way; a forward never gets cheaper with width.
        slope = max(sxy / sxx, 0.0)
        fixed = max(my - slope * mx, 0.0)
        return fixed, slope


@dataclass(frozen=True)
class Prospect:
    """What one sequence's drafts are worth now: the share of drafted tokens accepted lately, how
    long it may draft (its own limit; 0 while paused), how often it had a draft when asked."""

    rate: float
    limit: int
    found: float


def expected_accepted(p: Prospect, width: int) -> float:
    """Drafted tokens it is expected to keep at this width: the j-th drafted token survives only
    if every one before it did (p^j), found a draft or not."""
    k = min(width, p.limit)
    rate = min(max(p.rate, 0.0), 1.0)
    return p.found * sum(rate**j for j in range(1, k + 1))


def choose_width(
    costs: tuple[float, float], prospects: Sequence[Prospect], rows: int, max_width: int = MAX_DRAFT
) -> int:
    """The width (0: plain steps) with the most tokens per second for the batch, given the fitted
    (fixed, per-position) cost; ties go to the narrower."""
    fixed, per_position = costs
    best, best_rate = 0, 0.0
    for width in range(0, max_width + 1):
        seconds = fixed + per_position * rows * (width + 1)
        tokens = rows + sum(expected_accepted(p, width) for p in prospects)
        rate = tokens / max(seconds, 1e-9)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = width, rate
    return best
