"""A read-only HTTP server for model files: the launcher's for its ranks, a rank's for its peers.

    GET|HEAD /files/<percent-encoded name>     Authorization: Bearer <token>
    Range: bytes=<start>- | bytes=<start>-<end>  (one range; 206 + Content-Range)

Security: one listening socket per given cluster address (never a wildcard), a per-launch token
checked before anything else, and names looked up as exact keys of the launch's dict — nothing
from a request ever becomes a path. Speed: bodies go out with socket.sendfile (zero-copy), one
daemon thread per connection, so several ranks share the link as TCP shares it.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import os
import re
import socket
import stat
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO
from urllib.parse import unquote

from topology.errors import InputError

FILES_PREFIX = "/files/"
_IDLE_TIMEOUT_S = 300.0  # a keep-alive connection idle this long is dropped
_CHUNK = 8 << 20  # sendfile per 8 MiB: byte counts stay current, syscalls stay rare
_POLL_S = 0.05  # how soon a stopped server notices
_JOIN_S = 2.0  # __exit__ waits at most this long for connection threads
_MAX_LOG = 10_000  # the request log is for tests and the bench: keep it bounded
_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{0,19})")


def _json(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


class _Stats:
    """What the handlers report back: bytes per file and a request log, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[str, int] = {}
        self.log: deque[tuple[str, str, int]] = deque(maxlen=_MAX_LOG)

    def add_sent(self, name: str, n: int) -> None:
        with self.lock:
            self.sent[name] = self.sent.get(name, 0) + n

    def add_request(self, asked: str, range_header: str, status: int) -> None:
        with self.lock:
            self.log.append((asked, range_header, status))


class _Server(HTTPServer):
    """One listening socket; a daemon thread per connection, each connection tracked so
    stopping can shut it down instead of waiting for a slow client."""

    def __init__(
        self,
        sockaddr: tuple[Any, ...],
        family: int,
        files: Mapping[str, Path],
        token: bytes,
        stats: _Stats,
    ) -> None:
        self.address_family = family
        self.files = files
        self.token = token
        self.stats = stats
        self._conn_lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}
        super().__init__(sockaddr, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call getfqdn(): a reverse DNS lookup nobody needs.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name=f"model-file-server connection {client_address[0]}",
            daemon=True,
        )
        with self._conn_lock:
            self._conns[request] = t
        t.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as e:
            self.handle_error(request, client_address, e)
        finally:
            with self._conn_lock:
                self._conns.pop(request, None)
            self.shutdown_request(request)

    def handle_error(
        self, request: Any, client_address: Any, e: BaseException | None = None
    ) -> None:
        # A rank that goes away mid-file is routine, not worth a traceback; a bug gets one line.
        if e is not None and not isinstance(e, OSError):
            print(f"model file server: {type(e).__name__}: {e}", file=sys.stderr)

    def drop_connections(self) -> list[threading.Thread]:
        """Shut every open connection down (a blocked sendfile or read wakes up at once)."""
        with self._conn_lock:
            conns = list(self._conns.items())
        for sock, _ in conns:
            with contextlib.suppress(OSError):  # already gone
                sock.shutdown(socket.SHUT_RDWR)
        return [t for _, t in conns]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a rank fetches several files on one connection
    server_version = "mlx-cluster-share"
    timeout = _IDLE_TIMEOUT_S
    disable_nagle_algorithm = True  # headers then a small body must not wait on a delayed ACK
    server: _Server

    def version_string(self) -> str:
        return self.server_version  # no Python version for whoever asks

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the launcher's terminal is for the launch; the request log is in stats

    def handle_one_request(self) -> None:
        # The stdlib version answers unknown methods with 501 and an HTML page; every method
        # but GET and HEAD gets 405 here, and every error body is JSON.
        try:
            self.raw_requestline = self.rfile.readline(8193)
            if len(self.raw_requestline) > 8192:
                self.requestline, self.request_version, self.command = "", "", ""
                self.send_error(414)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self._dispatch()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Only parse_request() and the line-length check call this: malformed requests.
        self._error(code, message or self.responses.get(code, ("error",))[0])

    def _error(self, code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        body = _json(message)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        # After an error the rest of the request (a body, say) is unknown: start afresh.
        self.send_header("Connection", "close")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.close_connection = True
        if getattr(self, "command", "") != "HEAD":
            self.wfile.write(body)

    def _dispatch(self) -> None:
        asked = self.path
        range_header = self.headers.get("Range", "")
        if self.command not in ("GET", "HEAD"):
            status = 405
            self._error(405, "read-only: only GET and HEAD", {"Allow": "GET, HEAD"})
        elif not self._authorized():
            status = 401
            self._error(401, "missing or wrong token", {"WWW-Authenticate": "Bearer"})
        elif not self.path.startswith(FILES_PREFIX):
            status = 404
            self._error(404, "not found")
        else:
            asked = unquote(self.path[len(FILES_PREFIX) :])
            status = self._serve_file(asked, range_header)
        self.server.stats.add_request(asked, range_header, status)

    def _authorized(self) -> bool:
        scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # Header values arrive as latin-1 text; compare bytes so any value is comparable.
        return hmac.compare_digest(given.strip().encode("latin-1", "replace"), self.server.token)

    def _serve_file(self, name: str, range_header: str) -> int:
        path = self.server.files.get(name)  # an exact key: "../x" or "/etc/x" is simply absent
        if path is None:
            self._error(404, "not found")
            return 404
        try:
            # Opened per request: what is served is the file as it is on disk now.
            f: BinaryIO = open(path, "rb", buffering=0)  # noqa: SIM115  (closed below)
        except OSError:
            self._error(404, "not found")
            return 404
        with f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                self._error(404, "not found")
                return 404
            size = info.st_size
            start, end = 0, size - 1
            if range_header:
                m = _RANGE.fullmatch(range_header.strip())
                if m is None or (m.group(2) and int(m.group(2)) < int(m.group(1))):
                    self._error(400, "Range: expected bytes=<start>- or bytes=<start>-<end>")
                    return 400
                start = int(m.group(1))
                if start >= size:
                    self._error(416, "range not satisfiable", {"Content-Range": f"bytes */{size}"})
                    return 416
                if m.group(2):
                    end = min(int(m.group(2)), size - 1)
            status = 206 if range_header else 200
            count = end - start + 1
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(count))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Cache-Control", "no-store")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if self.command == "GET" and count > 0:
                self._send_body(name, f, start, count)
        return status

    def _send_body(self, name: str, f: BinaryIO, offset: int, count: int) -> None:
        # Blocking while the body goes out (one sendfile per chunk, no poll between); the idle
        # timeout applies to waiting for the next request. Stopping the server shuts the socket
        # down, which wakes a blocked sendfile.
        sock = self.connection
        sock.settimeout(None)
        try:
            while count > 0:
                try:
                    sent = sock.sendfile(f, offset, min(count, _CHUNK))
                except OSError:
                    self.close_connection = True  # the client went away: routine
                    return
                if sent == 0:
                    break
                self.server.stats.add_sent(name, sent)
                offset += sent
                count -= sent
            if count > 0:
                # The file shrank under us: the promised length cannot be kept, so hang up
                # and let the client's size/digest check notice.
                self.close_connection = True
        finally:
            if not self.close_connection:
                sock.settimeout(self.timeout)


def _sockaddr(address: str, port: int = 0) -> tuple[int, tuple[Any, ...]]:
    """The socket family and bind address for an IP literal; InputError for anything else."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise InputError(f"model file server: {address!r} is not an IP address") from None
    if ip.is_unspecified:
        raise InputError(f"model file server: will not listen on every address ({address})")
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    # getaddrinfo turns a scope ("fe80::1%en0") into the numeric scope id bind() needs.
    info = socket.getaddrinfo(address, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    return family, info[0][4]


class ModelFileServer:
    """Context manager; serves `files` (name -> absolute Path) on each address (on `port`,
    or any free port when 0)."""

    def __init__(
        self, files: Mapping[str, Path], token: str, addresses: Sequence[str], port: int = 0
    ) -> None:
        if not token or not token.isascii():
            raise ValueError("model file server: a token (ASCII) is required")
        if not addresses:
            raise ValueError("model file server: no address to listen on")
        self._files = dict(files)
        self._token = token.encode("ascii")
        self._addresses = list(dict.fromkeys(addresses))  # each once, in order
        self._port = port
        self._stats = _Stats()  # shared by every address: one chronological log
        self._servers: dict[str, _Server] = {}
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> ModelFileServer:
        try:
            for address in self._addresses:
                family, sockaddr = _sockaddr(address, self._port)
                try:
                    server = _Server(sockaddr, family, self._files, self._token, self._stats)
                except OSError as e:
                    raise InputError(
                        f"model file server: cannot listen on {address}: {e.strerror or e}"
                    ) from None
                self._servers[address] = server
        except BaseException:
            self._stop()
            self._servers = {}
            raise
        for address, server in self._servers.items():
            t = threading.Thread(
                target=server.serve_forever,
                args=(_POLL_S,),
                name=f"model-file-server {address}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        servers = list(self._servers.values())
        if self._threads:
            for server in servers:
                server.shutdown()  # no new connections from here on
        workers: list[threading.Thread] = []
        for server in servers:
            workers += server.drop_connections()
            server.server_close()
        for t in self._threads + workers:
            t.join(timeout=_JOIN_S)
        self._threads = []  # the servers stay in _servers: url() and the stats still answer

    def url(self, address: str) -> str:
        """The base URL a rank uses for this address: http://10.0.0.1:40123, IPv6 in brackets."""
        server = self._servers.get(address)
        if server is None:
            raise ValueError(f"model file server: not listening on {address!r}")
        host = f"[{address}]" if ":" in address else address
        return f"http://{host}:{server.server_port}"

    @property
    def urls(self) -> list[str]:
        return [self.url(a) for a in self._servers]

    def served_bytes(self) -> dict[str, int]:
        """Bytes sent so far per file name, over every address."""
        with self._stats.lock:
            return dict(self._stats.sent)

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        """(name or path asked, Range header or "", status) per request, oldest first."""
        with self._stats.lock:
            return list(self._stats.log)
