"""`mlx-cluster serve` holds no more after a re-plan than before it: a real `serve --local 2`
loses a rank (tensor ×2 → ×1, the warm-up), then its last rank four times (×1 restarted each
time), answers one chat request after each through the official client, and the serve
process's own probe (launcher/serve/memory_probe.py) says what it holds once the new ranks
serve. Threads and pipes must be exactly the warm-up's, Python memory may grow only by the
bounded histories' share (the dashboard's event log of MAX_EVENTS entries, the latency
windows of one minute) and RSS only by allocator noise."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from launch_helpers import tiny_model
from serve_helpers import Server, serving

from launcher.serve.memory_probe import ENV, PREFIX

__all__ = ["tiny_model"]

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="the probe reads /proc")

REPLANS = 4  # of the same shape, after the warm-up
RECOVER_WITHIN_S = 120.0  # serving again after a kill, on a busy 2-core machine
PROBE_LINE = re.compile("mlx-cluster: " + PREFIX + r"(\{.*\})")
# The Python memory a re-plan may leave behind: its 5 entries in the event log (at most
# MAX_EVENTS are kept) and the latency samples of one answer (kept for a minute), ~3 KiB here.
# Keeping each re-plan's LaunchTarget adds ~7 KiB more (and fails); kept rank processes show
# as pipes.
PYTHON_PER_REPLAN = 8 << 10
RSS_GROWTH = 2 << 20  # allocator noise over all the re-plans (a leak of 0.75 MiB each: 3 MiB)
POOL_THREAD = "AnyIO worker thread"  # the HTTP side's thread pool: it grows and idles out


def _probe(s: Server) -> dict[str, Any]:
    """What the serve process holds now, from its probe line on stderr."""
    seen = len(PROBE_LINE.findall(s.stderr))
    os.kill(s.proc.pid, signal.SIGUSR1)
    end = time.monotonic() + 30
    while len(found := PROBE_LINE.findall(s.stderr)) <= seen:
        assert time.monotonic() < end, f"no probe line within 30 s:\n{s.stderr}"
        time.sleep(0.05)
    probe: dict[str, Any] = json.loads(found[seen])
    return probe


def _replan(s: Server) -> None:
    """SIGKILL rank 0; once serve answers again, one chat request through the new ranks."""
    os.kill(s.ranks(1)[0], signal.SIGKILL)
    s.wait_health(False, 30)
    s.wait_health(True, RECOVER_WITHIN_S, every_s=0.2)
    with s.client() as client:  # closed: its connection is not counted as the server's
        out = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
        )
    assert out.choices[0].message.content


def _own_threads(probe: dict[str, Any]) -> list[str]:
    return [t for t in probe["threads"] if t != POOL_THREAD]


def test_serve_holds_no_more_after_each_replan_of_the_same_shape(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "1")
    with serving("--local", "2", "--model", str(tiny_model)) as s:
        s.wait_ready()
        _replan(s)  # tensor ×2 → ×1: new threads, arenas and pools find their size
        base = _probe(s)
        assert "rank 0 stderr" in base["threads"] and "rank 1 stderr" not in base["threads"]
        probes = []
        for _ in range(REPLANS):
            _replan(s)
            probes.append(_probe(s))
        assert s.stderr.count("restarting on the same hosts") == REPLANS  # ×1 each time
    for p in probes:
        assert _own_threads(p) == _own_threads(base), p["threads"]
        assert p["fds"].get("pipe") == base["fds"].get("pipe"), p["fds"]
        # A closed client's socket may still be closing on the server side.
        assert sum(p["fds"].values()) <= sum(base["fds"].values()) + 2, p["fds"]
    python = [p["python_bytes"] - base["python_bytes"] for p in probes]
    assert python[-1] <= REPLANS * PYTHON_PER_REPLAN, f"Python memory since the warm-up: {python}"
    rss = [p["rss_bytes"] - base["rss_bytes"] for p in probes]
    assert rss[-1] <= RSS_GROWTH, f"RSS since the warm-up: {rss}"
    assert "Traceback" not in s.stderr
