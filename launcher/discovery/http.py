"""The agent's read-only HTTP side: GET /snapshot and GET /facts, nothing else.

Both bodies are serialised once at start; a request never runs anything and never reads a body.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

SNAPSHOT_PATH = "/snapshot"
FACTS_PATH = "/facts"
_REQUEST_TIMEOUT_S = 5.0  # a client that stalls mid-request is dropped, not waited for


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True).encode() + b"\n"


def _handler(bodies: Mapping[str, bytes], server_version: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = _REQUEST_TIMEOUT_S

        def version_string(self) -> str:
            return server_version

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the agent's only useful line

        def _send(self, code: int, body: bytes, extra: Mapping[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            body = bodies.get(urlsplit(self.path).path)
            if body is None:
                self._send(404, _json_bytes({"error": f"only GET {' and '.join(bodies)}"}))
            else:
                self._send(200, body)

        def _refuse(self) -> None:
            self._send(405, _json_bytes({"error": "read-only: only GET"}), {"Allow": "GET"})

        do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _refuse
        do_TRACE = do_CONNECT = _refuse

    return Handler


class SnapshotServer:
    """One threaded HTTP server per address, all on the same port."""

    def __init__(
        self,
        addresses: tuple[str, ...],
        port: int,
        snapshot: Mapping[str, str | None],
        facts: Mapping[str, Any],
        server_version: str,
    ) -> None:
        handler = _handler(
            {SNAPSHOT_PATH: _json_bytes(dict(snapshot)), FACTS_PATH: _json_bytes(dict(facts))},
            server_version,
        )
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        try:
            for addr in addresses:
                server = ThreadingHTTPServer((addr, port), handler)
                server.daemon_threads = True
                port = server.server_address[1]  # port 0: the first bind picks, the rest follow
                self._servers.append(server)
        except OSError:
            self.close()
            raise
        self.port = port

    def start(self) -> None:
        for server in self._servers:
            t = threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        for server in self._servers:
            if self._threads:
                server.shutdown()
            server.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._servers, self._threads = [], []
