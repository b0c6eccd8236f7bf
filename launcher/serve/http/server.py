"""Where `mlx-cluster serve`'s HTTP app runs: uvicorn in a thread of the launcher process, on a
socket bound before any rank starts."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import uvicorn
from starlette.types import ASGIApp

SHUTDOWN_GRACE_S = 3  # open connections get this long once serve stops


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers (the serve command owns SIGINT/SIGTERM: ranks are
    stopped first, then this server), and saying when it accepts connections."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = threading.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.up.set()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on exactly host:port (0: any free port); OSError when impossible."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


class HttpServer:
    """uvicorn in a background thread on a socket bound here, so a taken port is one clear
    error before any rank starts and --port 0's real port is known at once."""

    def __init__(self, host: str, port: int, app: ASGIApp) -> None:
        self._sock = _bind(host, port)
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            app,
            http="h11",
            loop="asyncio",
            lifespan="off",
            access_log=False,  # a line per request would drown serve's own log
            log_level="warning",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        self._server = _Uvicorn(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="http"
        )

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        if not self._server.up.wait(timeout_s):
            self.stop(1.0)
            raise OSError("the HTTP server did not start")

    def stop(self, timeout_s: float) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._sock.close()
