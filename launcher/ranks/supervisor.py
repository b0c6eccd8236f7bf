"""Run every rank of one job to the end, or stop them all together.

Any rank exiting non-zero, its host or one of its links going quiet, the rank itself going
quiet (SIGSTOP, hung) or the job making no progress at its own pace (launcher/ranks/liveness.py)
stops every rank, as does Ctrl-C: SIGTERM first, SIGKILL for those still there after the grace.
Every rank gets an empty line each second: its guard stops the rank when they stop coming.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from launcher.hosts.probe import SSH_EXIT
from launcher.ranks.liveness import Deadlines, Liveness, overdue
from launcher.ranks.process import RankLaunch, RankProcess, Report, stop_all

__all__ = ["Deadlines", "Failure", "Outcome", "supervise"]
DEFAULT_DEADLINES = Deadlines()
KEEPALIVE_S = 1.0  # an empty line to every rank this often: its guard's sign that we are here

# After a rank exits non-zero, how long other exits may take to arrive before one is named: a
# killed remote rank's ssh can report after the neighbours that saw its sockets close.
SETTLE_S = 0.3
# What a rank says when only a peer failed (MLX's ring and jaccl; mlx-cluster's own guard).
PEER_GONE = ("closed by the peer", "Connection reset", "Broken pipe", "peer", "link to rank")

EXIT_OK = 0
EXIT_RANK_FAILED = 1
EXIT_BAD_INPUT = 2  # a rank found the model or job unusable (missing model, shapes)
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Failure:
    rank: int
    host: str
    reason: str
    stderr_tail: tuple[str, ...] = ()
    killed: tuple[str, ...] = ()  # ranks that ignored SIGTERM for the grace: "rank 1 on h1"

    def message(self) -> str:
        head = f"rank {self.rank} on {self.host} {self.reason}; every rank was stopped"
        if self.killed:
            head += f" ({', '.join(self.killed)} only by SIGKILL, after the SIGTERM grace)"
        if not self.stderr_tail:
            return head
        return (
            head + "\nlast lines of its stderr:\n" + "\n".join(f"  | {s}" for s in self.stderr_tail)
        )


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    result: dict[str, Any] | None = None  # rank 0's "result" event
    failure: Failure | None = None
    interrupted: bool = False


TextSink = Callable[[str], None]
EventSink = Callable[[int, dict[str, Any]], None]


@contextlib.contextmanager
def interrupt_flag(stop: threading.Event | None = None) -> Iterator[threading.Event]:
    """SIGINT/SIGTERM/SIGHUP set a flag the loop checks, so the ranks are stopped in order."""
    flag = stop or threading.Event()  # a caller's `stop` ends the job like Ctrl-C
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, lambda _n, _f: flag.set())
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def supervise(
    launches: list[RankLaunch],
    on_text: TextSink,
    on_event: EventSink | None = None,
    deadlines: Deadlines = DEFAULT_DEADLINES,
    on_started: Callable[[list[RankProcess]], None] | None = None,
    stop: threading.Event | None = None,
) -> Outcome:
    """Start the ranks, stream rank 0's text to on_text, and return how the job ended.
    on_started gets the started ranks (serve writes requests to rank 0); setting `stop` ends
    the job as Ctrl-C would (for callers off the main thread, where signals cannot reach)."""
    reports: queue.Queue[Report] = queue.Queue()
    ranks: list[RankProcess] = []
    beating = threading.Event()
    with interrupt_flag(stop) as interrupted:
        try:
            for launch in launches:
                ranks.append(RankProcess(launch, reports))
            if on_started is not None:
                on_started(ranks)
            threading.Thread(
                target=_keep_alive, args=(ranks, beating), daemon=True, name="keep-alive"
            ).start()
            outcome = _watch(ranks, reports, on_text, on_event, deadlines, interrupted)
        finally:
            beating.set()
            killed = stop_all(ranks, deadlines.grace_s)
    if outcome.failure is not None and killed:
        names = tuple(f"rank {r.launch.rank} on {r.launch.host}" for r in killed)
        outcome = replace(outcome, failure=replace(outcome.failure, killed=names))
    return outcome


def _keep_alive(ranks: list[RankProcess], done: threading.Event) -> None:
    """Keep-alives from their own thread: a write that blocks (a host cut off with its pipe
    full) must never hold up the deadlines."""
    while not done.wait(KEEPALIVE_S):
        for r in ranks:
            if r.running:
                r.keep_alive()


class _Watch:
    """The supervisor's loop state: who exited, the clocks, rank 0's result."""

    def __init__(
        self, ranks: list[RankProcess], on_text: TextSink, on_event: EventSink | None
    ) -> None:
        now = time.monotonic()
        self.ranks = ranks
        self.clock = Liveness.start(len(ranks), now)
        self.hosts = [r.launch.host for r in ranks]
        self.result: dict[str, Any] | None = None
        self.exited: set[int] = set()
        self._on_text = on_text
        self._on_event = on_event

    def take(self, rep: Report, now: float) -> None:
        """Hand a rank's text or event on and note it on the clocks."""
        self.clock.heard(rep.rank, rep.event, now)
        if rep.kind == "text" and rep.rank == 0:
            self._on_text(rep.text)
        elif rep.event is not None:
            if rep.event.get("event") == "result" and rep.rank == 0:
                self.result = rep.event
            if self._on_event is not None:
                self._on_event(rep.rank, rep.event)

    def finish(self, reports: queue.Queue[Report]) -> None:
        """Pass on everything the ranks wrote before exiting (readers end just after the exit)."""
        for r in self.ranks:
            r.drain_output(1.0)
        while True:
            try:
                rep = reports.get_nowait()
            except queue.Empty:
                return
            if rep.kind != "exit":
                self.take(rep, time.monotonic())


def _watch(
    ranks: list[RankProcess],
    reports: queue.Queue[Report],
    on_text: TextSink,
    on_event: EventSink | None,
    d: Deadlines,
    interrupted: threading.Event,
) -> Outcome:
    w = _Watch(ranks, on_text, on_event)
    while len(w.exited) < len(ranks):
        if interrupted.is_set():
            return Outcome(EXIT_INTERRUPTED, w.result, interrupted=True)
        try:
            rep: Report | None = reports.get(timeout=0.1)
        except queue.Empty:
            rep = None
        now = time.monotonic()
        if rep is not None and rep.kind == "exit":
            w.exited.add(rep.rank)
            if rep.code != 0:
                rank, code = _first_cause(ranks, reports, w, rep)
                failed = ranks[rank]
                status = EXIT_BAD_INPUT if failed.error_kind == "input" else EXIT_RANK_FAILED
                return Outcome(status, w.result, _exit_failure(failed, code))
        elif rep is not None:
            w.take(rep, now)
        alive = [i for i in range(len(ranks)) if i not in w.exited]
        late = overdue(w.clock, d, alive, w.hosts, now)
        if late is not None:
            return Outcome(EXIT_RANK_FAILED, w.result, _failure(ranks[late[0]], late[1]))
    w.finish(reports)
    if w.result is None:
        return Outcome(EXIT_RANK_FAILED, None, _failure(ranks[0], "exited without a result"))
    return Outcome(EXIT_OK, w.result)


def _first_cause(
    ranks: list[RankProcess], reports: queue.Queue[Report], w: _Watch, first: Report
) -> tuple[int, int | None]:
    """The rank whose failure made the others fail: exits within SETTLE_S of the first are
    gathered, and a rank killed by a signal (or its ssh link dropping) comes before one that
    failed on its own, which comes before one that only saw a peer go (a ring socket closed):
    the killed rank's exit can reach us after its neighbours'."""
    exits = [first]
    end = time.monotonic() + SETTLE_S
    while (left := end - time.monotonic()) > 0:
        try:
            rep = reports.get(timeout=left)
        except queue.Empty:
            break
        if rep.kind == "exit":
            w.exited.add(rep.rank)
            if rep.code != 0:
                exits.append(rep)
        else:
            w.take(rep, time.monotonic())
    for rep in exits:
        ranks[rep.rank].drain_output(1.0)

    def cause(rep: Report) -> int:
        r, code = ranks[rep.rank], rep.code
        if code is not None and (code < 0 or (code == SSH_EXIT and r.launch.remote)):
            return 0
        said = r.error or ""
        return 2 if any(s in said for s in PEER_GONE) or not said else 1

    best = min(exits, key=cause)  # min keeps the earliest of equals
    return best.rank, best.code


def _failure(r: RankProcess, reason: str) -> Failure:
    return Failure(r.launch.rank, r.launch.host, f"{reason} [stage: {r.stage}]", tuple(r.tail))


def _exit_failure(r: RankProcess, code: int | None) -> Failure:
    if code is not None and code < 0:
        try:
            reason = f"was killed by {signal.Signals(-code).name}"
        except ValueError:  # a real-time signal has no name
            reason = f"was killed by signal {-code}"
    elif code == SSH_EXIT and r.launch.remote:  # ssh's own code: a signal or a broken link
        reason = (
            f"exited with code {code} (ssh: the remote rank was killed or the connection dropped)"
        )
    else:
        reason = f"exited with code {code}"
    if r.error:
        reason += f": {r.error}"
    return _failure(r, reason)
