"""The HTTP server of `mlx-cluster serve`: stdlib ThreadingHTTPServer, a thread per request.

Routes: GET /health (no key needed: for load balancers), GET /v1/models, POST
/v1/chat/completions and POST /v1/completions (streamed as server-sent events when asked).
A request beyond --max-concurrency gets 429 at once rather than waiting (OpenAI clients retry
429 by themselves); the accepted ones queue on rank 0, which decodes them one at a time.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from launcher.serve.cluster import ServeCluster
from launcher.serve.openai_api import (
    ApiError,
    GenerateRequest,
    chunk_body,
    models_body,
    parse_chat,
    parse_completion,
    response_body,
    usage,
)
from launcher.serve.tickets import Busy, Unavailable

MAX_BODY_BYTES = 16 << 20
Event = dict[str, Any]


class ServeServer(ThreadingHTTPServer):
    daemon_threads = True  # a client that never reads must not keep serve from exiting

    def __init__(
        self, address: tuple[str, int], cluster: ServeCluster, model_id: str, api_key: str | None
    ) -> None:
        super().__init__(address, ServeHandler)
        self.cluster, self.model_id, self.api_key = cluster, model_id, api_key
        self.created = int(time.time())


def _unavailable(message: str) -> ApiError:
    return ApiError(503, message, "server_error", code="cluster_unavailable")


def _first_event(events: Iterator[Event]) -> Event:
    """Wait for rank 0 to take the request: an error before that still gets its own status."""
    event = next(events)
    name = event.get("event")
    if name == "request_error":
        raise ApiError(400, str(event.get("message")), code="bad_prompt")
    if name == "failed":
        raise _unavailable(str(event.get("message")))
    return event


class ServeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that never sends its announced body must not hold a thread
    server: ServeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown serve's own log

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        routes: dict[str, tuple[str, Callable[[bytes], None]]] = {
            "/health": ("GET", lambda _b: self._health()),
            "/v1/models": ("GET", lambda _b: self._json(200, self._models())),
            "/v1/chat/completions": ("POST", lambda b: self._generate(parse_chat(b))),
            "/v1/completions": ("POST", lambda b: self._generate(parse_completion(b))),
        }
        try:
            body = self._body() if method == "POST" else b""
            if path.startswith("/v1/models/") and method == "GET":
                self._check_key()
                return self._model(path.removeprefix("/v1/models/"))
            if path not in routes:
                raise ApiError(404, f"no route for {method} {path}", code="not_found")
            allowed, handle = routes[path]
            if method != allowed:
                raise ApiError(
                    405, f"{path} takes {allowed}, not {method}", code="method_not_allowed"
                )
            if path != "/health":
                self._check_key()
            handle(body)
        except ApiError as e:
            self._json(e.status, e.body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise ApiError(411, "a POST needs a Content-Length header", code="length_required")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(413, f"the body is larger than {MAX_BODY_BYTES >> 20} MiB")
        return self.rfile.read(int(length))

    def _check_key(self) -> None:
        key = self.server.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        token = given.removeprefix("Bearer ").strip() if given.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(), key.encode()):
            what = "no API key given" if not token else "incorrect API key"
            raise ApiError(
                401, f"{what}: send 'Authorization: Bearer <--api-key>'", code="invalid_api_key"
            )

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _health(self) -> None:
        ok, body = self.server.cluster.health()
        self._json(200 if ok else 503, {**body, "model": self.server.model_id})

    def _models(self) -> dict[str, Any]:
        return models_body(self.server.model_id, self.server.created)

    def _model(self, name: str) -> None:
        if name != self.server.model_id:
            raise ApiError(404, f"model {name!r} is not served here", code="model_not_found")
        self._json(200, self._models()["data"][0])

    def _generate(self, request: GenerateRequest) -> None:
        cluster = self.server.cluster
        try:
            ticket = cluster.submit(request)
        except Unavailable as e:
            raise _unavailable(f"the cluster is not serving: {e}") from None
        except Busy as e:
            raise ApiError(429, str(e), "rate_limit_error", code="too_many_requests") from None
        events = cluster.events(ticket)
        _first_event(events)
        if request.stream:
            self._stream(request, ticket.id, events)
            return
        text, finish, counts = "", "stop", usage(0, 0)
        for event in events:
            name = event.get("event")
            if name == "delta":
                text += str(event.get("text", ""))
            elif name == "done":
                finish = str(event.get("finish_reason"))
                counts = usage(int(event["prompt_tokens"]), int(event["completion_tokens"]))
            elif name in ("failed", "request_error"):
                raise _unavailable(f"the request failed: {event.get('message')}")
        body = response_body(request.kind, ticket.id, self.server.model_id, text, finish, counts)
        self._json(200, body)

    def _stream(self, request: GenerateRequest, request_id: str, events: Iterator[Event]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        model, kind = self.server.model_id, request.kind
        if kind == "chat":
            self._sse(chunk_body(kind, request_id, model, "", first=True))
        for event in events:
            name = event.get("event")
            if name == "delta":
                self._sse(chunk_body(kind, request_id, model, str(event.get("text", ""))))
            elif name == "done":
                finish = str(event.get("finish_reason"))
                self._sse(chunk_body(kind, request_id, model, None, finish))
                if request.include_usage:
                    counts = usage(int(event["prompt_tokens"]), int(event["completion_tokens"]))
                    self._sse(chunk_body(kind, request_id, model, None, counts=counts))
                self._chunk(b"data: [DONE]\n\n")
            elif name in ("failed", "request_error"):
                error = _unavailable(f"the request failed: {event.get('message')}")
                self._sse(error.body())
                self.close_connection = True
        self._chunk(b"")  # the last chunk of a chunked body

    def _sse(self, body: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(body).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
