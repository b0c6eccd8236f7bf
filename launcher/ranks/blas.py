"""Which BLAS each rank's MLX multiplies with, as its `load` event says (cluster/blas.py).

`launch` prints one line per distinct value (`BLAS on h1, h2: openblas 0.3.21, 1 thread (…)`)
and puts the value per rank in its --json output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from topology.errors import one_line

_MAX_VALUE = 300  # a rank's own words: one line, bounded


class BlasSeen:
    """Collects the `blas` field of every rank's `load` event (None: not reported)."""

    def __init__(self, ranks: int) -> None:
        self.values: list[str | None] = [None] * ranks

    def __call__(self, rank: int, event: dict[str, Any]) -> None:
        value = event.get("blas")
        if event.get("event") == "load" and isinstance(value, str) and 0 <= rank < len(self.values):
            self.values[rank] = one_line(value, _MAX_VALUE)


def blas_lines(values: Sequence[str | None], hosts: Sequence[str]) -> list[str]:
    """One line per distinct BLAS, naming the hosts (each once) whose ranks use it."""
    by_value: dict[str, list[str]] = {}
    for value, host in zip(values, hosts, strict=False):
        if value is not None and host not in by_value.setdefault(value, []):
            by_value[value].append(host)
    return [f"BLAS on {', '.join(names)}: {value}" for value, names in by_value.items()]
