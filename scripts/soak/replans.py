"""The failover soak's own criteria: each kill ended the requests open at it with an error (soon,
never a hang), /health went down and came back, serving resumed, serve counted the failovers,
and memory did not grow across re-plans.

Re-plans are told apart by the set of rank pids: every plan starts new rank processes. Each
plan's memory is the median, over its samples taken between A and A + 30 s after its first
sample (A = min(60 s, kill period / 4)), of the sum of its ranks' RSS (and of MLX active +
cache): the same age after every start, so plans of the same shape compare like with like."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .killer import Kill
from .load import Record
from .sampler import Sample
from .verdict import END_WITHIN_S, GROWTH_LIMIT, Row, _mib, _verdict

AGE_WINDOW_S = 30.0


@dataclass
class Plan:
    pids: frozenset[int]
    shape: str  # "tensor x3"
    first_t: float
    samples: list[Sample] = field(default_factory=list)


def plans(samples: list[Sample]) -> list[Plan]:
    out: list[Plan] = []
    for s in samples:
        want = s.plan.rpartition("x")[2]
        if s.health != 200 or not s.ranks or not want.isdigit() or len(s.ranks) != int(want):
            continue  # down, or caught between plans (a rank gone, /health not yet 503)
        pids = frozenset(r.pid for r in s.ranks.values())
        if not out or out[-1].pids != pids:
            out.append(Plan(pids, s.plan, s.t))
        out[-1].samples.append(s)
    return out


def _at_age(plan: Plan, age_s: float) -> tuple[float | None, float | None]:
    chosen = [s for s in plan.samples if age_s <= s.t - plan.first_t < age_s + AGE_WINDOW_S]
    rss = [sum(r.rss or 0 for r in s.ranks.values()) for s in chosen]
    mlx = [sum(r.mlx or 0 for r in s.ranks.values()) for s in chosen]
    return (statistics.median(rss) if rss else None, statistics.median(mlx) if mlx else None)


def kill_rows(records: list[Record], kills: list[Kill], failovers: float | None) -> list[Row]:
    rows: list[Row] = []
    for i, k in enumerate(kills, 1):
        open_ = [r for r in records if not r.hostile and r.start < k.t < r.end]
        errored = [r for r in open_ if not r.ok and r.error != "hang"]
        late = [r for r in errored if r.end - k.t > END_WITHIN_S]
        ok = len(errored) == len(open_) and not late
        latest = max((r.end - k.t for r in open_), default=0.0)
        rows.append(Row(
            f"kill {i} (t={k.t:.0f} s, rank {k.rank}, {k.plan_before}): open requests end with an "
            "error", f"{len(errored)} of {len(open_)} errored, the last after {latest:.1f} s",
            f"all, within {END_WITHIN_S:.0f} s", _verdict(ok),
        ))  # fmt: skip
        resumed = k.resumed_after_s is not None
        down = "-" if k.down_after_s is None else f"{k.down_after_s:.1f} s"
        up = "-" if k.up_after_s is None else f"{k.up_after_s:.1f} s"
        measured = f"/health down after {down}, up after {up}, " + (
            f"a request answered after {k.resumed_after_s:.1f} s on {k.plan_after}"
            if resumed else f"probe failed: {k.probe_error}"
        )  # fmt: skip
        rows.append(Row(f"kill {i}: serving resumes", measured, "yes", _verdict(resumed)))
    seen = "-" if failovers is None else f"{failovers:.0f}"
    counted = failovers is not None and failovers >= len(kills) > 0
    rows.append(
        Row(
            "failovers counted by serve (/metrics)",
            f"{seen} for {len(kills)} kills",
            "= kills",
            _verdict(counted),
        )
    )
    return rows


def stale_rows(samples: list[Sample]) -> Row:
    """Old ranks must be gone once the new plan serves: while /health is 200 the live rank
    processes are exactly the plan's. One sample may catch a rank mid-exit; two in a row may
    not."""
    mismatched, run, worst = 0, 0, 0
    for s in samples:
        want = s.plan.rpartition("x")[2]
        if s.health == 200 and want.isdigit() and len(s.ranks) != int(want):
            mismatched, run = mismatched + 1, run + 1
            worst = max(worst, run)
        else:
            run = 0
    measured = f"{mismatched} of {len(samples)} samples differ, at most {worst} in a row"
    return Row("rank processes = the plan's while serving", measured, "< 2 in a row",
               _verdict(worst < 2))  # fmt: skip


def launcher_row(samples: list[Sample], kills: list[Kill]) -> Row:
    """The serve process outlives every plan: its RSS over the 30 s before each kill (and the
    run's end), for a leak that re-plans would leave behind."""
    ends = [k.t for k in kills] + [max((s.t for s in samples), default=0.0)]
    series: list[float | None] = []
    for end in ends:
        rss = [s.launcher_rss for s in samples if end - AGE_WINDOW_S <= s.t <= end]
        known = [x for x in rss if x]
        series.append(statistics.median(known) if known else None)
    measured = ", ".join(_mib(x) for x in series)
    return Row("serve process RSS before each kill, then at the end", measured, "", "info")


def replan_rows(samples: list[Sample], kill_every_s: float) -> list[Row]:
    found = plans(samples)
    age = min(60.0, kill_every_s / 4)
    rows = [Row("plans seen", " → ".join(f"{p.shape} at {p.first_t:.0f} s" for p in found), "",
                "info")]  # fmt: skip
    by_shape: dict[str, list[tuple[float | None, float | None]]] = {}
    for p in found:
        by_shape.setdefault(p.shape, []).append(_at_age(p, age))
    for shape, figures in by_shape.items():
        usable = [f for f in figures if f[0] is not None]
        if len(usable) < 2:
            continue
        for i, name in ((0, "RSS"), (1, "MLX active + cache")):
            first, last = usable[0][i], usable[-1][i]
            series = ", ".join(_mib(f[i]) for f in usable)
            if not first or last is None:
                rows.append(Row(f"{shape}: ranks' {name} across re-plans", series, "", "FAIL"))
                continue
            g = last / first - 1
            rows.append(Row(
                f"{shape}: ranks' {name} {age:.0f} s after each start, across re-plans",
                f"{series} ({g:+.1%})", "≤ +5 %", _verdict(g <= GROWTH_LIMIT),
            ))  # fmt: skip
    if len(rows) == 1:
        rows.append(Row("memory across re-plans of the same shape",
                        "no shape ran twice: nothing to compare", "", "info"))  # fmt: skip
    return rows
