"""Progress of one copy from peers: DownloadSteps for the launcher, from several file threads.

Each file reports its start, its bytes every TICK_S while they grow (one ticker thread for all
files), and its end; steps go out one at a time and in order. No MLX here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from cluster.files import hub_fetch
from cluster.files.hub_fetch import DownloadProgress, DownloadStep


class FetchProgress:
    """The DownloadSteps of one fetch_from_peers call (none when `progress` is None)."""

    def __init__(self, progress: DownloadProgress | None, total: int, expected: int) -> None:
        self.progress, self.total, self.expected = progress, total, expected
        self.done = 0
        self.finished = 0  # bytes of the files done
        self.lock = threading.Lock()  # held while calling `progress`: one step at a time
        self.live: dict[str, list[int]] = {}  # name -> [bytes, size, bytes last reported]
        self.stop = threading.Event()

    def _emit(self, name: str, got: int, size: int) -> None:
        if self.progress is not None:
            received = self.finished + sum(state[0] for state in self.live.values())
            step = DownloadStep(self.done, self.total, name, got, size, received, self.expected)
            self.progress(step)

    def start(self, name: str, got: int, size: int) -> None:
        with self.lock:
            self.live[name] = [got, size, got]
            self._emit(name, got, size)

    def set(self, name: str, got: int) -> None:
        self.live[name][0] = got  # only the file's own threads write its count

    def end(self, name: str, size: int) -> None:
        with self.lock:
            self.live.pop(name, None)
            self.done += 1
            self.finished += size
            self._emit(name, size, size)

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        thread = threading.Thread(target=self._tick, daemon=True)
        if self.progress is not None:
            thread.start()
        try:
            yield
        finally:
            self.stop.set()
            if thread.is_alive():
                thread.join()

    def _tick(self) -> None:
        # The Hub download's interval: the launcher sees both kinds of copy at one pace.
        while not self.stop.wait(hub_fetch.TICK_S):
            with self.lock:
                for name, state in self.live.items():
                    if state[0] != state[2]:
                        state[2] = state[0]
                        self._emit(name, state[0], state[1])
