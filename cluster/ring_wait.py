"""Let the ring backend's socket threads sleep while they wait, where ranks share cores.

MLX's ring backend (mlx/distributed/ring/ring.cpp, `SocketThread::worker`) sets its sockets
non-blocking and retries `recv` in a loop while a receive is pending: a pipeline stage waiting
for the previous one, or a tensor rank waiting in an all-reduce for a slower peer, spins a whole
core. Where ranks share a host's cores (`--local N`, a Linux node running more ranks than it has
cores to spare) that spin takes the CPU the awaited rank needs: two 2-rank servers on 2 cores
answered 3× slower than with the sockets blocking (15 s against 45–51 s for the same requests).

Made blocking with a short receive/send timeout, the worker sleeps in the kernel until data
arrives, and the timeout returns EAGAIN, which the worker already treats as "try again", so it
still gets to its pending sends. Where every rank has its cores, the spin costs nothing and the
sleep's wake-up costs a little (tensor ×2 decode ~5 % slower alone here), so this is done only
where ranks would otherwise take cores from each other. MLX_CLUSTER_RING_WAIT=spin|sleep
decides by hand. Linux only (the sockets are found in /proc/self/fd). Only the ring's own
connections are changed: those with an end at an address and port of its hostfile.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys
from collections.abc import Mapping

CHOICE_ENV = "MLX_CLUSTER_RING_WAIT"  # auto (default) | spin | sleep
# Linux rounds socket timeouts up to a scheduler tick (1–10 ms): a sleeping worker wakes at once
# when data comes, and a send queued behind a pending receive waits at most this long.
TIMEOUT_S = 0.001


def should_sleep(ranks_here: int | None, cores: int, environ: Mapping[str, str]) -> bool:
    """Whether this rank's ring sockets should block: asked for, or (auto) on Linux when the
    ranks here and their waiting threads outnumber the cores."""
    choice = environ.get(CHOICE_ENV, "auto")
    if choice in ("spin", "sleep"):
        return choice == "sleep"
    return sys.platform == "linux" and ranks_here is not None and 2 * ranks_here > cores


def sockets() -> set[int]:
    """This process's open socket descriptors (empty where /proc/self/fd does not exist)."""
    found: set[int] = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(int(name))
        except OSError:  # closed since listed
            continue
    return found


def ring_endpoints(hostfile: str) -> set[tuple[str, int]]:
    """The (address, port) pairs of a ring hostfile (MLX_HOSTFILE: one list of "ip:port" per
    rank): every ring connection has one of them at one end. Empty when it cannot be read."""
    try:
        ranks = json.loads(hostfile)
        return {(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for r in ranks for a in r}
    except (ValueError, TypeError, IndexError, AttributeError):
        return set()


def sleep_while_waiting(endpoints: set[tuple[str, int]], timeout_s: float = TIMEOUT_S) -> int:
    """Make each TCP socket of this process with one end at a ring endpoint blocking, with
    receive and send timeouts; how many were changed. Other sockets are left as they are."""
    tv = struct.pack("ll", 0, int(timeout_s * 1e6))  # struct timeval
    changed = 0
    for fd in sockets():
        try:
            s = socket.socket(fileno=os.dup(fd))  # a duplicate shares the socket and its flags
        except OSError:
            continue
        with s:
            if s.type != socket.SOCK_STREAM or not _at(s, endpoints):
                continue
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            except OSError:
                continue
            changed += 1
    return changed


def _at(s: socket.socket, endpoints: set[tuple[str, int]]) -> bool:
    """Whether either end of `s` is one of the endpoints (an unconnected socket: its own)."""
    ends = []
    for name in (s.getsockname, s.getpeername):
        try:
            address = name()
        except OSError:  # not connected
            continue
        if isinstance(address, tuple):
            ends.append((str(address[0]), int(address[1])))
    return any(end in endpoints for end in ends)
