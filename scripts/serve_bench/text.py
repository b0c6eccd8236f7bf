"""Formatting shared by the progress lines (on stderr) and the tables."""

from __future__ import annotations

import sys


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fmt(x: float | None, scale: float = 1.0, width: int = 0) -> str:
    return f"{'-' if x is None else f'{x * scale:.1f}':>{width}}"


def ratio_row(label: str, a: float | None, b: float | None, scale: float, spec: str) -> str:
    """A table row: a, b (times scale, formatted with spec) and a / b, "-" where missing."""
    ratio = "-" if not a or not b else f"{a / b:.2f}x"
    left = "-" if a is None else format(a * scale, spec)
    right = "-" if b is None else format(b * scale, spec)
    return f"| {label} | {left} | {right} | {ratio} |"
