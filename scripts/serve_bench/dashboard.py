"""A dashboard's stream as an open page reads it: a client of GET /v1/cluster/stream counting
every state event, for --dashboard-cost and --dashboard-ab."""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

from .text import progress


class DashboardClient:
    """Reads /v1/cluster/stream in a thread until closed; counts the state events."""

    def __init__(self, base_url: str, quiet: bool = False) -> None:
        self.quiet = quiet
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.events = 0
        self.began = time.monotonic()
        self._conn: http.client.HTTPConnection | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True, name="dashboard")
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                self._conn.request("GET", "/v1/cluster/stream")
                answer = self._conn.getresponse()
                if answer.status != 200:
                    raise OSError(f"/v1/cluster/stream answered {answer.status}")
                while not self._stop.is_set() and (line := answer.readline()):
                    self.events += line.startswith(b"event: state")
            except (OSError, http.client.HTTPException) as e:
                if not self._stop.is_set():
                    progress(f"dashboard stream: {e}; reconnecting")
                    time.sleep(1)

    def close(self) -> None:
        self._stop.set()
        if self._conn is not None and self._conn.sock is not None:
            self._conn.sock.close()  # unblocks the reader's readline
        self._thread.join(5)
        if not self.quiet:
            took = time.monotonic() - self.began
            progress(f"dashboard stream: {self.events} state events in {took:.0f} s")
