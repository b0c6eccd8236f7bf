"""`python -m cluster.rank_guard`: a GIL-free watchdog beside each rank.

An MLX call can hold the GIL while it waits on a peer that vanished (seen: `mx.clear_cache()`
waiting on a ring all_sum), which freezes every Python thread of the rank. So the rank hands its
stdin to this small process (no MLX in it), which:
  * relays the launcher's lines to the rank, dropping the empty keep-alive lines the launcher
    writes every second; stdin EOF (the launcher is gone) or no line for the job's
    orphan_timeout_s (the launcher is cut off) kills the rank;
  * heartbeats the rank's links over UDP, on the addresses its collectives use: it pings the
    peers the rank connects to and answers the pings of those that connect to it. A link that
    stays silent for LINK_DOWN_S is reported once (`link_down`) naming both ends; jaccl never
    notices a dead peer, and a cable can go while both hosts still reach the launcher;
  * says it is alive (`guard`) every GUARD_EVERY_S, so the launcher can tell a frozen rank on a
    live host from a host that is gone.

argv: RANK_PID CONFIG_JSON ({"rank", "orphan_s", "links": [...], "events_lock_fd"}: cluster/job.py,
cluster/event_writer.py). stdin = the
launcher's pipe, stdout = the rank's new stdin, stderr = the rank's stderr (event lines).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from cluster.event_writer import GUARD_WAIT_S, EventWriter
from cluster.job import event_line

EOF_GRACE_S = 2.0  # the rank exits by itself on EOF (code 3) unless its GIL is held
LINK_BEAT_S = 0.5  # a ping to every peer this often
LINK_DOWN_S = 3.0  # a link silent this long (after it was up) is down
LINK_FIRST_S = 60.0  # a link never heard from this long after the start is down too
GUARD_EVERY_S = 1.0
PING, PONG = b"mlx-cluster ping ", b"mlx-cluster pong "  # + the sender's rank


@dataclass
class Link:
    """One heartbeated link: `outgoing` when this rank pings the peer (it connects to the peer's
    collective address), else it answers the peer's pings on its own address."""

    peer: int
    addr: str  # this rank's address on the link ("" until a ping's route tells)
    peer_addr: str  # ("" on an incoming link until the first ping comes)
    outgoing: bool
    port: int  # the peer's port (outgoing) or our own (incoming)
    sock: socket.socket | None = None
    heard: float | None = None  # when the peer was last heard on this link
    reported: bool = False


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


_writer = EventWriter(None)  # main() gives it the rank's lock on their shared stderr


def _say(event: str, **fields: Any) -> None:
    with contextlib.suppress(OSError):  # never inside one of the rank's own lines
        _writer.write(event_line(event, **fields), wait_s=GUARD_WAIT_S)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return os.getppid() != pid  # re-parented: the rank is gone


class Links:
    """The UDP side: one bound socket per own address for the peers that ping us, one
    connected socket per peer we ping."""

    def __init__(self, rank: int, raw: list[dict[str, Any]]) -> None:
        self.rank = rank
        self.links: list[Link] = []
        self.listening: dict[tuple[str, int], socket.socket] = {}
        for item in raw:
            link = Link(
                int(item["peer"]),
                str(item.get("addr", "")),
                str(item.get("peer_addr", "")),
                bool(item["outgoing"]),
                int(item["port"]),
            )
            if link.outgoing:
                link.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                link.sock.setblocking(False)
            else:
                key = (link.addr, link.port)
                if key not in self.listening:
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    try:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        s.bind(key)
                    except OSError as e:  # the port is taken: this link goes unwatched
                        s.close()
                        _say("link_unwatched", rank=rank, peer=link.peer, addr=link.addr,
                             port=link.port, message=str(e))  # fmt: skip
                        continue
                    s.setblocking(False)
                    self.listening[key] = s
                link.sock = self.listening[key]
            self.links.append(link)
        self.started = time.monotonic()
        self.last_beat = 0.0

    def sockets(self) -> list[socket.socket]:
        out = list(self.listening.values())
        return out + [link.sock for link in self.links if link.outgoing and link.sock is not None]

    def beat(self, now: float) -> None:
        if now - self.last_beat < LINK_BEAT_S:
            return
        self.last_beat = now
        ping = PING + str(self.rank).encode()
        for link in self.links:
            if not link.outgoing or link.sock is None:
                continue
            try:
                if not link.addr:  # connect() picks the route: our address on this link
                    link.sock.connect((link.peer_addr, link.port))
                    link.addr = str(link.sock.getsockname()[0])
                link.sock.send(ping)
            except OSError:  # unreachable (a cable down): the silence says it
                pass

    def read(self, sock: socket.socket, now: float) -> None:
        while True:
            try:
                data, source = sock.recvfrom(64)
            except OSError:  # nothing more, or ECONNREFUSED from an earlier ping (no listener)
                return
            kind, sender = data[: len(PING)], data[len(PING) :]
            if not sender.isdigit() or kind not in (PING, PONG):
                continue
            peer = int(sender)
            if kind == PING:  # a peer that connects to us: answer on the same link
                with contextlib.suppress(OSError):
                    sock.sendto(PONG + str(self.rank).encode(), source)
            for link in self.links:
                if link.sock is sock and link.peer == peer:
                    link.heard = now
                    link.peer_addr = link.peer_addr or str(source[0])

    def check(self, now: float) -> None:
        for link in self.links:
            if link.reported:
                continue
            if link.heard is not None:
                silent = now - link.heard
                if silent <= LINK_DOWN_S:
                    continue
            else:
                silent = now - self.started
                if silent <= LINK_FIRST_S:
                    continue
            link.reported = True
            _say("link_down", rank=self.rank, peer=link.peer, addr=link.addr,
                 peer_addr=link.peer_addr, silent_s=round(silent, 1),
                 ever_up=link.heard is not None)  # fmt: skip


def guard(rank_pid: int, rank: int, orphan_s: float, links: Links) -> int:
    stdin_open = True
    inbox, pending = b"", b""
    last_line = last_said = time.monotonic()
    eof_at: float | None = None
    os.set_blocking(1, False)
    while True:
        readers: list[Any] = [0] if stdin_open else []
        readers += links.sockets()
        writers = [1] if pending else []
        readable, writable, _ = select.select(readers, writers, [], 0.1)
        now = time.monotonic()
        if 0 in readable:
            data = os.read(0, 65536)
            if data:
                last_line = now
                inbox += data
                lines, _, inbox = inbox.rpartition(b"\n")
                # Empty lines are the launcher's keep-alives: the rank never sees them.
                pending += b"".join(line + b"\n" for line in lines.split(b"\n") if line)
            else:  # the launcher is gone: let the rank see EOF too, then make sure
                stdin_open, eof_at, pending = False, now, b""
                os.close(1)
        for sock in readable:
            if isinstance(sock, socket.socket):
                links.read(sock, now)
        if 1 in writable and pending and stdin_open:
            try:
                pending = pending[os.write(1, pending) :]
            except BlockingIOError:
                pass
            except OSError:  # the rank is exiting: nothing more to relay
                pending = b""
        links.beat(now)
        links.check(now)
        if now - last_said >= GUARD_EVERY_S:
            last_said = now
            _say("guard", rank=rank)
        if _gone(rank_pid):
            return 0
        if eof_at is not None and now - eof_at > EOF_GRACE_S:
            _kill(rank_pid)
            return 0
        if stdin_open and orphan_s > 0 and now - last_line > orphan_s:
            message = (
                f"nothing from the launcher for {orphan_s:g} s: it is cut off or gone; "
                "this rank stops itself"
            )
            _say("error", rank=rank, kind="orphaned", message=message)
            _kill(rank_pid)
            return 0


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the rank's stop, not ours: we follow it
    rank_pid, config = int(sys.argv[1]), json.loads(sys.argv[2])
    rank = int(config["rank"])
    global _writer
    if config.get("events_lock_fd") is not None:
        _writer = EventWriter(int(config["events_lock_fd"]))
    return guard(rank_pid, rank, float(config["orphan_s"]), Links(rank, config["links"]))


if __name__ == "__main__":
    sys.exit(main())
