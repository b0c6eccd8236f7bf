"""Time `topology check` and `plan` in-process on the 8-host example snapshot.

    .venv/bin/python scripts/bench_topology.py [--reps N]

Prints milliseconds per run (median and best) for each stage: reading + parsing the snapshot,
the check (link graph, ring search, problems), the planner, and the CLI's work end to end.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher.hosts.snapshots import load_snapshot  # noqa: E402
from launcher.planning.model_source import load_model_spec  # noqa: E402
from topology.planning.plan import plan_cluster  # noqa: E402
from topology.problems import check  # noqa: E402
from topology.report import check_json, text_report  # noqa: E402

SNAPSHOT = ROOT / "hostfiles" / "snapshots" / "mesh-8x-m3-ultra"
MODEL = ROOT / "tests" / "fixtures" / "models" / "qwen3-235b-a22b-4bit"


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1000)
    return statistics.median(runs), min(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    reps = parser.parse_args().reps
    facts = load_snapshot(SNAPSHOT)
    result = check(facts, "jaccl-ring")
    spec = load_model_spec(str(MODEL))

    def end_to_end() -> None:
        r = check(load_snapshot(SNAPSHOT))
        text_report(r)
        check_json(r)
        plan_cluster(check(load_snapshot(SNAPSHOT), "jaccl-ring"), spec)

    stages: list[tuple[str, Callable[[], object]]] = [
        ("load + parse snapshot (8 hosts)", lambda: load_snapshot(SNAPSHOT)),
        ("check, target jaccl (4 missing links)", lambda: check(facts)),
        ("check, target jaccl-ring (ring search)", lambda: check(facts, "jaccl-ring")),
        ("plan (Qwen3-235B-A22B 4-bit, auto)", lambda: plan_cluster(result, spec)),
        ("snapshot -> check -> report -> plan", end_to_end),
    ]
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {reps} runs each"
    )
    print(f"{'stage':44} {'median ms':>10} {'best ms':>9}")
    for name, fn in stages:
        med, best = timed(fn, reps)
        print(f"{name:44} {med:10.2f} {best:9.2f}")


if __name__ == "__main__":
    main()
