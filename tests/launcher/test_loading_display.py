"""The launcher's loading line on a terminal: a copy from a peer shows bytes, rate, time left."""

from __future__ import annotations

import io
import time

import pytest

from launcher.cli import launch


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_copy_shows_bytes_rate_and_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    out = Terminal()
    display = launch._LoadingDisplay(out, 2)
    step = {"event": "progress", "stage": "download", "done": 0, "total": 4, "file": "a"}
    display(1, {**step, "received": 0, "expected": 400_000_000})
    assert out.getvalue().endswith("rank 1: downloading 0/4 0.0 MB/400.0 MB")
    clock[0] += 2.0
    display(1, {**step, "done": 1, "received": 100_000_000, "expected": 400_000_000})
    assert out.getvalue().endswith("rank 1: downloading 1/4 100.0 MB/400.0 MB 50.0 MB/s, 6 s left")


def test_a_hub_download_without_sizes_counts_files() -> None:
    out = Terminal()
    display = launch._LoadingDisplay(out, 1)
    display(0, {"event": "progress", "stage": "download", "done": 2, "total": 5, "file": "x"})
    assert out.getvalue().endswith("rank 0: downloading 2/5")
