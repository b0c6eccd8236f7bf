"""The report: the machine line, the summary (medians over repetitions, each workload its own
part), the markdown tables, the notes under them and the --json document."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from .stats import Results
from .workloads import Workload


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import mlx.core as mx

    from launcher.bench.machine import machine_info  # the chip's name, as `bench` reports it

    cpu = machine_info()["chip"]

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "system": platform.system(),
        "device": "GPU (Metal)" if mx.metal.is_available() else "CPU",
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "openai": version("openai"),
    }


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['system']}, MLX {m['mlx']} on {m['device']}, "
        f"mlx-lm {m['mlx_lm']}, openai client {m['openai']}"
    )


def summarize(
    results: Results, workloads: tuple[Workload[Any], ...], args: argparse.Namespace
) -> dict[str, Any]:
    """Each workload's medians under its section ("rounds": per kind/concurrency and server)."""
    out: dict[str, Any] = {}
    for workload in workloads:
        out.setdefault(workload.section, {}).update(workload.summarize(results, args))
    return out


def table(
    summary: dict[str, Any], workloads: tuple[Workload[Any], ...], args: argparse.Namespace
) -> list[str]:
    lines = [
        "| metric (median over reps) | mlx-cluster | mlx-lm | ours / mlx-lm |",
        "|---|---:|---:|---:|",
    ]
    for workload in workloads:
        lines += workload.rows(summary, args)
    for workload in workloads:
        lines += workload.tables(summary, args)
    return lines


def notes(summary: dict[str, Any], results: Results, args: argparse.Namespace) -> Iterator[str]:
    for key, pair in summary["rounds"].items():
        for name, med in pair.items():
            if med["rejected"]:
                yield f"{name}, {key}: {med['rejected']} requests rejected (429) after the retries"
            if med["retries"]:
                causes = ", ".join(f"{c} x{n}" for c, n in sorted(med["retry_causes"].items()))
                yield f"{name}, {key}: the openai client retried {med['retries']} times ({causes})"
            if med["token_source"] not in ([], ["usage"]):
                yield f"{name}, {key}: completion tokens counted as content chunks (no usage)"
    spins = []
    for name, share in results.idle_cpu.items():
        if share is not None:
            spins.append(f"{name} {100 * share:.0f}%")
    if spins:
        yield "CPU used by each server's processes while idle (% of a core): " + ", ".join(spins)
        worst = max(s for s in results.idle_cpu.values() if s is not None)
        if not args.one_at_a_time and worst > 0.2 and (os.cpu_count() or 1) <= 8:
            yield (
                "both servers stayed up and an idle one spins on this few-core machine, so each "
                "round shared the CPU with the other server: --one-at-a-time avoids that"
            )
    for name, took in results.ready_s.items():
        if took:
            yield f"{name}: start to ready after warm-up {statistics.median(took):.1f} s"


def to_json(
    results: Results, summary: dict[str, Any], info: dict[str, Any], failure: str | None
) -> Any:
    return {
        **info,
        "failure": failure,
        "summary": summary,
        "idle_cpu_share": results.idle_cpu,
        "ready_s": results.ready_s,
        "rounds": [
            {**{k: v for k, v in asdict(r).items() if k != "requests"}, "summary": r.summary(),
             "requests": [asdict(q) for q in r.requests]}
            for r in results.rounds
        ],
        "multi_turn": results.turns,
    }  # fmt: skip
