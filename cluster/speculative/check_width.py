"""How many drafted tokens the batch checks per forward: the width that gives the most tokens per
second of step time, from what forwards cost on these ranks (measured as they run, no separate
calibration) and what each sequence's drafts have recently been worth.

The choice is one width for the batch: each sequence drafts up to it (and up to its own limit,
draft_length.py). A step of `rows` rows at width W computes rows × (W + 1) positions, every row
padded to the longest draft, or, where the model's layers pack (packing.py), each row's own
(one plus its draft); it costs fixed + per position × positions, plus what checking itself costs
(the step in flight waited for), and emits one token per row plus the drafted tokens accepted.
Width 0 is the plain step. Rank 0 chooses, and
the step message carries the width (serve/control.py), so every rank drafts alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.speculative.draft_length import MAX_DRAFT

WEIGHT = 0.2  # of a new step time in its position count's running mean
MIN_STEPS = 3  # steps at a position count before its mean counts in the fit
FIT_WEIGHT_CAP = 16  # a point's weight in the fit grows with its steps up to this
SEPARATE_LINES = 3  # position counts checks need before they get a line of their own
# A check must promise this much more than plain steps: the fitted line and the acceptance are
# estimates, and a check that only breaks even still costs (chats at 8 clients here ran at
# 0.86-0.90x plain steps without it).
MARGIN = 0.1


@dataclass(frozen=True)
class StepCost:
    """A decode step's time: fixed + per_position x positions read, plus check_s more when it
    checks drafts (it waits for the step in flight and has none computing behind it). Once
    checks are measured at enough position counts they get a slope of their own: a check's
    positions can cost more than a plain step's rows (on a CPU a query position beyond the
    first attends over the whole context through the general attention kernel)."""

    fixed_s: float
    per_position_s: float
    check_s: float = 0.0
    # The most positions a measured step read (0: not known). A line fitted on narrow steps
    # says little about far wider ones (noise can flatten its slope to nothing, and a CPU's
    # cost is not a line): checks widen at most to twice what was measured, step by step.
    measured_positions: int = 0
    check_per_position_s: float | None = None  # None: per_position_s
    # Plain steps' own running means by positions (rows): where a row count is measured, its
    # mean, not the line (a line through several row counts misses each of them).
    plain_means: tuple[tuple[int, float], ...] = ()

    @property
    def check_slope(self) -> float:
        return (
            self.per_position_s if self.check_per_position_s is None else self.check_per_position_s
        )

    def seconds(self, positions: float, checks: bool) -> float:
        plain = self.fixed_s + self.per_position_s * positions
        if not checks:
            return dict(self.plain_means).get(int(positions), plain)
        # never below a plain step of as many positions (a steeper line can start lower)
        return max(self.fixed_s + self.check_s + self.check_slope * positions, plain)


@dataclass
class StepCosts:
    """Decode steps' wall times by the positions their forward read (rows × (width + 1)) and
    whether they checked drafts."""

    means: dict[tuple[int, bool], float] = field(default_factory=dict)
    steps: dict[tuple[int, bool], int] = field(default_factory=dict)

    def record(self, positions: int, seconds: float, checked: bool = False) -> None:
        if positions <= 0 or seconds <= 0:
            return
        key = (positions, checked)
        n = self.steps.get(key, 0)
        mean = self.means.get(key, seconds)
        # The plain mean while a count is new, then a running one: the cost follows the load.
        w = max(WEIGHT, 1 / (n + 1))
        self.means[key] = (1 - w) * mean + w * seconds
        self.steps[key] = n + 1

    def fit(self) -> StepCost | None:
        """Weighted least squares over the (positions, checked) kinds measured MIN_STEPS times
        or more: checks get a line of their own once measured at SEPARATE_LINES position
        counts, and plain steps theirs; until then one slope, an intercept for plain steps and
        one for checks (once checks are measured at two position counts); None until two
        position counts are measured (no slope without them). Plain steps at a measured row
        count are priced by their own mean."""
        points = [
            (p, checked, m, min(self.steps[(p, checked)], FIT_WEIGHT_CAP))
            for (p, checked), m in self.means.items()
            if self.steps[(p, checked)] >= MIN_STEPS
        ]
        if len({p for p, _, _, _ in points}) < 2:
            return None
        widest = max(p for p, _ in self.means)
        groups = [[pt for pt in points if pt[1] is kind] for kind in (False, True)]
        plain_means = tuple(sorted((p, m) for p, checked, m, _ in points if not checked))
        if len({p for p, _, _, _ in groups[1]}) >= SEPARATE_LINES:
            # Checks measured widely enough for a line of their own (packed checks vary in
            # positions step by step); plain steps keep theirs, or their means with its slope.
            start, steep = _line(groups[1])
            if len(plain_means) >= 2:
                base, slope = _line(groups[0])
            else:
                base, slope = start, steep
                if plain_means:
                    base = plain_means[0][1] - steep * plain_means[0][0]
            base = max(base, 0.0)
            return StepCost(base, slope, start - base, widest, steep, plain_means)
        if len({p for p, _, _, _ in groups[1]}) < 2:
            # Checks at one position count give no slope of their own: their intercept would
            # take up all of their difference from plain steps, whose few close row counts give
            # a slope of noise (then any width looks as cheap as one). One line through all.
            groups = [points, []]
        centre = [_means(g) for g in groups]  # (mean positions, mean seconds) of each kind
        slope = _slope(groups, centre)
        plain, checking = (None if c is None else c[1] - slope * c[0] for c in centre)
        if plain is None:  # only checks measured: their intercept is all there is
            return StepCost(max(checking or 0.0, 0.0), slope, measured_positions=widest)
        extra = 0.0 if checking is None else max(checking - plain, 0.0)
        return StepCost(max(plain, 0.0), slope, extra, widest, plain_means=plain_means)


def _slope(
    groups: list[list[tuple[int, bool, float, int]]], centre: list[tuple[float, float] | None]
) -> float:
    """One slope through every group, each about its own centre."""
    sxx = sxy = 0.0
    for group, c in zip(groups, centre, strict=True):
        for p, _, m, w in group:
            assert c is not None
            sxx += w * (p - c[0]) ** 2
            sxy += w * (p - c[0]) * (m - c[1])
    # Noise can tilt two close points either way; a forward never gets cheaper with width.
    return max(sxy / sxx, 0.0) if sxx > 0 else 0.0


def _line(group: list[tuple[int, bool, float, int]]) -> tuple[float, float]:
    """(intercept, slope) of one group's points."""
    centre = _means(group)
    assert centre is not None
    slope = _slope([group], [centre])
    return centre[1] - slope * centre[0], slope


def _means(points: list[tuple[int, bool, float, int]]) -> tuple[float, float] | None:
    total = sum(w for _, _, _, w in points)
    if not total:
        return None
    return (
        sum(w * p for p, _, _, w in points) / total,
        sum(w * m for _, _, m, w in points) / total,
    )


@dataclass(frozen=True)
class Prospect:
    """What one sequence's drafts are worth now: the chance a drafted token holds when the one
    before it did (recent checks), how long it may draft (0 while paused), how often it had a
    draft when asked."""

    rate: float
    limit: int
    found: float
    fresh: bool = False  # asked too few times yet for its own figures to say much


def expected_accepted(p: Prospect, width: int) -> float:
    """Drafted tokens it is expected to keep at this width: the j-th drafted token survives only
    if every one before it did (p^j), found a draft or not."""
    k = min(width, p.limit)
    rate = min(max(p.rate, 0.0), 1.0)
    return p.found * sum(rate**j for j in range(1, k + 1))


def choose_width(
    cost: StepCost,
    prospects: Sequence[Prospect],
    rows: int,
    max_width: int = MAX_DRAFT,
    packed: bool = False,
) -> int:
    """The width (0: plain steps) with the most expected tokens per second for the batch, no
    wider than twice the positions measured, plain steps unless a check promises MARGIN more;
    ties go to the narrower. At a width above 0 a step checks only when some sequence has a
    draft (each has one with its share `found`); otherwise it is a plain step. `packed`: a check
    computes each row's own positions, not rows × (width + 1)."""
    drafting = 1.0
    for p in prospects:
        drafting *= 1 - (_found(p) if p.limit else 0.0)
    drafting = 1 - drafting  # some sequence has a draft
    plain = cost.seconds(rows, False)
    best, best_rate = 0, rows / max(plain, 1e-9) * (1 + MARGIN)
    widest = max(2 * cost.measured_positions, 2 * rows) if cost.measured_positions else None
    for width in range(1, max_width + 1):
        if packed:
            most = rows + sum(min(width, p.limit) for p in prospects)
            drafted = sum(_found(p) * min(width, p.limit) for p in prospects)
            seconds = (
                drafting * cost.seconds(rows, True)
                + cost.check_slope * drafted
                + (1 - drafting) * plain
            )
        else:
            most = rows * (width + 1)
            seconds = drafting * cost.seconds(most, True) + (1 - drafting) * plain
        if widest is not None and most > widest:
            break
        tokens = rows + sum(expected_accepted(p, width) for p in prospects)
        rate = tokens / max(seconds, 1e-9)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = width, rate
    return best


def _found(p: Prospect) -> float:
    return min(max(p.found, 0.0), 1.0)


def learning_pays(
    cost: StepCost, prospects: Sequence[Prospect], rows: int, packed: bool = False
) -> bool:
    """Whether checking the fresh sequences' drafts to learn their worth could pay: some width
    would, were every fresh sequence's drafts found and taken whole. A batch that checks only
    when it is cheap at worst: at 8 rows on a CPU a check of one token a row costs 1.6x a plain
    step, which no single newcomer could ever repay (chats at 16 clients, joining one by one,
    ran at 0.86x plain steps while each was asked)."""
    best = Prospect(rate=1.0, limit=MAX_DRAFT, found=1.0)
    hoped = [best if p.fresh and p.limit else p for p in prospects]
    return choose_width(cost, hoped, rows, packed=packed) > 0
