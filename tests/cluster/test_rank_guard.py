"""The rank's guard process on its own (cluster/rank_guard.py), as real processes on loopback:
two guards heartbeat their link and one reports it down, naming both ends, when the other goes;
a heartbeat port that is taken leaves that link unwatched (said once) and the guard running;
keep-alive lines are dropped and other lines relayed; no keep-alive for orphan_s stops the rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from cluster.event_writer import EventWriter
from cluster.job import event_line, parse_event

LOOPBACK = "127.0.0.1"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _guard(
    rank: int, links: list[dict[str, Any]], orphan_s: float = 0.0
) -> subprocess.Popen[bytes]:
    """A guard whose "rank" is this test process (it is the guard's parent)."""
    config = json.dumps({"rank": rank, "orphan_s": orphan_s, "links": links})
    return subprocess.Popen(
        [sys.executable, "-m", "cluster.rank_guard", str(os.getpid()), config],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _events(proc: subprocess.Popen[bytes], name: str, timeout_s: float) -> list[dict[str, Any]]:
    """Events `name` from the guard's stderr, read until one comes or timeout_s passes."""
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    found: list[dict[str, Any]] = []
    end = time.monotonic() + timeout_s
    buf = b""
    while time.monotonic() < end and not found:
        chunk = proc.stderr.read() or b""
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            event = parse_event(line.decode())
            if event is not None and event["event"] == name:
                found.append(event)
        time.sleep(0.05)
    return found


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(5)


def test_two_guards_heartbeat_their_link_and_report_it_down_when_one_goes() -> None:
    port = _free_udp_port()
    a = _guard(0, [{"peer": 1, "peer_addr": LOOPBACK, "port": port, "outgoing": True}])
    b = _guard(1, [{"peer": 0, "addr": LOOPBACK, "port": port, "outgoing": False}])
    try:
        assert _events(a, "guard", 10)  # both up and saying so
        assert _events(a, "link_down", 5) == []  # heartbeats flowing: nothing to report
        b.kill()
        gone = time.monotonic()
        (down,) = _events(a, "link_down", 10)
        assert time.monotonic() - gone < 3.0 + 2.0
        assert (down["rank"], down["peer"], down["peer_addr"]) == (0, 1, LOOPBACK)
        assert down["addr"] == LOOPBACK and down["ever_up"] is True
    finally:
        _stop(a, b)


def test_a_taken_heartbeat_port_leaves_the_link_unwatched_and_the_guard_relaying() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((LOOPBACK, 0))
        port = int(taken.getsockname()[1])
        g = _guard(1, [{"peer": 0, "addr": LOOPBACK, "port": port, "outgoing": False}])
        try:
            (said,) = _events(g, "link_unwatched", 10)
            assert (said["peer"], said["port"]) == (0, port)
            assert g.stdin is not None and g.stdout is not None
            g.stdin.write(b'\n\n{"id": 1}\n\n')  # keep-alives around one real line
            g.stdin.flush()
            assert g.stdout.readline() == b'{"id": 1}\n'
            assert g.poll() is None
        finally:
            _stop(g)


def test_no_keep_alive_for_orphan_s_stops_the_rank() -> None:
    """The "rank" here is a sleeping child; its guard must kill it when the lines stop."""
    rank = subprocess.Popen([sys.executable, "-c", _RANK], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert rank.stderr is not None
        assert rank.stderr.readline().strip() == b"guarded"
        started = time.monotonic()
        assert rank.wait(15) == -9  # SIGKILL from its guard
        assert 1.5 <= time.monotonic() - started < 6
    finally:
        _stop(rank)


# A stand-in rank that starts a guard on its own stdin with orphan_s 2, then sleeps.
_RANK = """
import json, os, subprocess, sys, time
config = json.dumps({"rank": 0, "orphan_s": 2.0, "links": []})
subprocess.Popen([sys.executable, "-m", "cluster.rank_guard", str(os.getpid()), config],
                 stdin=0, stdout=subprocess.DEVNULL)
sys.stderr.write("guarded\\n"); sys.stderr.flush()
time.sleep(60)
"""


def _long_lines_beside_the_guard(lock: bool) -> tuple[int, int, list[bytes]]:
    """This process writes long event lines, as a rank with a result does, on the pipe the guard
    says `guard` on; a slow reader lets the pipe fill mid-line. Returns (long lines whole,
    guard lines whole, torn lines)."""
    read_fd, write_fd = os.pipe()
    writer = EventWriter.create()
    writer.out_fd = write_fd
    config: dict[str, Any] = {"rank": 0, "orphan_s": 0.0, "links": []}
    if lock:
        config["events_lock_fd"] = writer.lock_fd
    guard = subprocess.Popen(
        [sys.executable, "-m", "cluster.rank_guard", str(os.getpid()), json.dumps(config)],
        stdin=subprocess.PIPE,
        stderr=write_fd,
        pass_fds=(writer.lock_fd,),
    )
    got: list[bytes] = []

    def read() -> None:
        while chunk := os.read(read_fd, 4096):
            got.append(chunk)
            time.sleep(0.0005)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        end = time.monotonic() + 3.5  # the guard speaks every second
        while time.monotonic() < end:
            writer.write(event_line("result", rank=0, logits=[0.125] * 40_000))
    finally:
        _stop(guard)
        os.close(write_fd)
        reader.join(10)
        os.close(read_fd)
    lines = b"".join(got).split(b"\n")[:-1]
    events = [parse_event(line.decode()) for line in lines]
    torn = [line[:80] for line, e in zip(lines, events, strict=True) if e is None]
    named = [e["event"] for e in events if e is not None]
    return named.count("result"), named.count("guard"), torn


def test_the_guards_lines_never_land_inside_the_ranks_long_ones() -> None:
    """Seen in CI: a `guard` line written into the middle of rank 0's result line, which a pipe
    does not keep whole beyond 4 KiB."""
    results, guards, torn = _long_lines_beside_the_guard(lock=True)
    assert torn == [] and results > 10 and guards >= 2, (results, guards, torn)
