"""The HTTP side of `mlx-cluster serve`: a Starlette app under uvicorn, in a thread of the launcher.

Routes: GET /health and GET /metrics (no key needed: for load balancers and scrapers), GET
/v1/models[/{id}], POST /v1/chat/completions and POST /v1/completions (OpenAI), POST
/v1/messages and POST /v1/messages/count_tokens (Anthropic); answers are streamed as server-sent
events when asked. Every error is the route's API's error object with its status (Anthropic's
under /v1/messages, OpenAI's elsewhere). Admission: up to --max-concurrency requests decode at
once and --max-queue more wait on rank 0; beyond that, 429 at once (both SDKs retry 429 by
themselves). A request waits on an asyncio queue fed by rank 0's events (tickets.py), never
holding a thread; a client that disconnects — mid-stream or while a whole answer is being made —
has its request withdrawn from the ranks (cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from launcher.serve import anthropic_api
from launcher.serve.anthropic_api import parse_count_tokens, parse_messages
from launcher.serve.anthropic_bodies import AnthropicAnswer, CountAnswer
from launcher.serve.cluster import ServeCluster
from launcher.serve.metrics import CONTENT_TYPE, ServeMetrics
from launcher.serve.openai_api import parse_chat, parse_completion
from launcher.serve.openai_bodies import OpenAIAnswer, models_body
from launcher.serve.request_api import ApiError, GenerateRequest
from launcher.serve.tickets import Busy, Event, Ticket, Unavailable

MAX_BODY_BYTES = 16 << 20
GONE_STATUS = 499  # what /metrics counts for a client that left before its answer (nginx's)
SHUTDOWN_GRACE_S = 3  # open connections get this long once serve stops
ANTHROPIC_ROUTES = "/v1/messages"  # and everything under it
T = TypeVar("T")
Log = Callable[[str], None]


class Answer(Protocol):
    """One request's answer in its API's shapes (openai_bodies.py, anthropic_bodies.py)."""

    @property
    def finished(self) -> bool: ...

    def opening(self) -> list[bytes]: ...

    def feed(self, event: Event) -> list[bytes]: ...

    def closing(self) -> list[bytes]: ...

    def failure(self, error: dict[str, Any]) -> list[bytes]: ...

    def body(self) -> dict[str, Any]: ...


MakeAnswer = Callable[[GenerateRequest, str, str], Answer]


class _Gone(Exception):
    """The client disconnected before its answer was ready."""


def _unavailable(message: str) -> ApiError:
    return ApiError(503, message, "server_error", code="cluster_unavailable")


def _is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_ROUTES or path.startswith(ANTHROPIC_ROUTES + "/")


def _error_body(e: ApiError, path: str) -> dict[str, Any]:
    return anthropic_api.error_body(e) if _is_anthropic(path) else e.body()


def _error(e: ApiError, path: str) -> JSONResponse:
    headers = {"Connection": "close"} if e.status in (411, 413) else None  # body left unread
    return JSONResponse(_error_body(e, path), status_code=e.status, headers=headers)


def _ended(event: Event) -> ApiError:
    """The error a request ends with: its own (400 for what it asked, 500 for what failed while
    decoding it, the batch going on) or the cluster's (503: the ranks went down)."""
    message = str(event.get("message"))
    if event.get("event") == "failed":
        return _unavailable(f"the request failed: {message}")
    if event.get("kind") == "input":  # it names what (the context, a schema feature, a template)
        return ApiError(400, message, code=str(event.get("code") or "bad_prompt"))
    return ApiError(500, f"the request failed: {message}", "server_error", code="request_failed")


def _check_first(event: Event) -> None:
    """Rank 0 has taken the request or refused it: a refusal still gets its own status."""
    if event.get("event") in ("failed", "request_error"):
        raise _ended(event)


async def _disconnected(receive: Receive) -> None:
    """Returns when the client goes away (the request body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ServeApp:
    """The ASGI app: routes, key checks, admission, streaming and cancellation."""

    def __init__(
        self,
        cluster: ServeCluster,
        metrics: ServeMetrics,
        model_id: str,
        api_key: str | None,
        log: Log,
    ) -> None:
        self.cluster, self.metrics, self.log = cluster, metrics, log
        self.model_id, self.api_key = model_id, api_key
        self.created = int(time.time())
        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/models/{name:path}", self._model, methods=["GET"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completion, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
        ]
        handlers: dict[Any, Callable[[Request, Exception], Any]] = {
            ApiError: self._api_error,
            HTTPException: self._http_error,
            Exception: self._internal_error,
        }
        self.app: ASGIApp = Starlette(routes=routes, exception_handlers=handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Trailing slashes are ignored; every answer is counted by endpoint and status; an
        unexpected error is one log line and a 500, never a traceback."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"].rstrip("/") or "/"
        scope = {**scope, "path": path}
        status = GONE_STATUS  # no answer started: the client went away first

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception as e:  # Starlette has answered 500 already (_internal_error)
            self.log(f"error answering {scope['method']} {path}: {type(e).__name__}: {e}")
        finally:
            self.metrics.request(path, status)

    async def _api_error(self, request: Request, e: Exception) -> Response:
        assert isinstance(e, ApiError)
        return _error(e, request.url.path)

    async def _http_error(self, request: Request, e: Exception) -> Response:
        """Starlette's own 404 / 405, as the route's API's error objects."""
        assert isinstance(e, HTTPException)
        method, path = request.method, request.url.path.rstrip("/") or "/"
        if e.status_code == 405:
            allow = (e.headers or {}).get("Allow", "")
            takes = allow.split(",")[0].strip()  # GET routes also take HEAD: name the first
            message = f"{path} takes {takes}, not {method}"
            answer = _error(ApiError(405, message, code="method_not_allowed"), path)
            answer.headers["Allow"] = allow
            return answer
        if e.status_code == 404:
            return _error(ApiError(404, f"no route for {method} {path}", code="not_found"), path)
        return _error(ApiError(e.status_code, str(e.detail)), path)

    async def _internal_error(self, request: Request, e: Exception) -> Response:
        message = f"internal error: {type(e).__name__}: {e}"
        error = ApiError(500, message, "server_error", code="internal_error")
        return _error(error, request.url.path)

    def _check_key(self, request: Request) -> None:
        """With --api-key: `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
        (Anthropic's), on every route that needs a key."""
        key = self.api_key
        if key is None:
            return
        scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
        token = credentials.strip() if scheme.lower() == "bearer" else ""  # RFC 9110: any case
        token = token or request.headers.get("x-api-key", "").strip()
        if not hmac.compare_digest(token.encode(), key.encode()):
            what = "no API key given" if not token else "incorrect API key"
            raise ApiError(
                401,
                f"{what}: send 'Authorization: Bearer <--api-key>' or 'x-api-key: <--api-key>'",
                code="invalid_api_key",
            )

    async def _body(self, request: Request) -> bytes:
        length = request.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise ApiError(411, "a POST needs a Content-Length header", code="length_required")
        if int(length) > MAX_BODY_BYTES:
            raise ApiError(413, f"the body is larger than {MAX_BODY_BYTES >> 20} MiB")
        self._check_key(request)
        return await request.body()

    async def _health(self, _request: Request) -> Response:
        ok, body = self.cluster.health()
        return JSONResponse({**body, "model": self.model_id}, status_code=200 if ok else 503)

    async def _metrics(self, _request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def _models(self, request: Request) -> Response:
        self._check_key(request)
        return JSONResponse(models_body(self.model_id, self.created))

    async def _model(self, request: Request) -> Response:
        self._check_key(request)
        name = request.path_params["name"]
        if name != self.model_id:
            raise ApiError(404, f"model {name!r} is not served here", code="model_not_found")
        return JSONResponse(models_body(self.model_id, self.created)["data"][0])

    async def _chat(self, request: Request) -> Response:
        generate = parse_chat(await self._body(request))
        return await self._generate(request, generate, OpenAIAnswer)

    async def _completion(self, request: Request) -> Response:
        generate = parse_completion(await self._body(request))
        return await self._generate(request, generate, OpenAIAnswer)

    async def _messages(self, request: Request) -> Response:
        generate = parse_messages(await self._body(request))
        return await self._generate(request, generate, AnthropicAnswer)

    async def _count_tokens(self, request: Request) -> Response:
        generate = parse_count_tokens(await self._body(request))
        return await self._generate(request, generate, CountAnswer)

    async def _generate(
        self, request: Request, generate: GenerateRequest, make: MakeAnswer
    ) -> Response:
        loop = asyncio.get_running_loop()
        try:  # a pipe write to rank 0: off the event loop
            ticket = await run_in_threadpool(self.cluster.submit, generate, loop)
        except Unavailable as e:
            raise _unavailable(f"the cluster is not serving: {e}") from None
        except Busy as e:
            raise ApiError(429, str(e), "rate_limit_error", code="too_many_requests") from None
        answer = make(generate, ticket.id, self.model_id)
        streaming = False
        try:
            first = await self._unless_gone(request, self.cluster.next_event(ticket))
            _check_first(first)
            if generate.stream:
                streaming = True  # from here on the stream owns the ticket
                events = self._stream(answer, ticket, first, request.url.path)
                headers = {"Cache-Control": "no-cache"}
                return StreamingResponse(events, media_type="text/event-stream", headers=headers)
            body = await self._unless_gone(request, self._collect(answer, ticket, first))
            return JSONResponse(body)
        except _Gone:
            return Response(status_code=GONE_STATUS)  # nobody reads it
        finally:
            if not streaming:
                self._withdraw(ticket)

    async def _unless_gone(self, request: Request, work: Coroutine[Any, Any, T]) -> T:
        """`work`'s result, or _Gone as soon as the client disconnects."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            task.cancel()  # no-op when done
        if task.done() and not task.cancelled():
            return task.result()
        raise _Gone

    def _withdraw(self, ticket: Ticket) -> None:
        """Cancel the request on rank 0 unless it has ended (cancel writes to a pipe: off the
        loop, and not awaited — this runs while the request's task is being torn down)."""
        if ticket.id not in self.cluster.tickets:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing: the ranks go too
            asyncio.get_running_loop().run_in_executor(None, self.cluster.cancel, ticket)

    async def _collect(self, answer: Answer, ticket: Ticket, event: Event) -> dict[str, Any]:
        while True:
            if event.get("event") in ("failed", "request_error"):
                raise _ended(event)
            answer.feed(event)
            if answer.finished:
                return answer.body()
            event = await self.cluster.next_event(ticket)

    async def _stream(
        self, answer: Answer, ticket: Ticket, event: Event, path: str
    ) -> AsyncIterator[bytes]:
        """The SSE body. Starlette cancels it when the client disconnects: then the request
        is withdrawn from the ranks."""
        ended = False
        try:
            for frame in answer.opening():
                yield frame
            while True:
                if event.get("event") in ("failed", "request_error"):
                    error = _ended(event)
                    for frame in answer.failure(_error_body(error, path)):
                        yield frame
                    ended = True
                    return
                for frame in answer.feed(event):
                    yield frame
                if answer.finished:
                    for frame in answer.closing():
                        yield frame
                    ended = True
                    return
                event = await self.cluster.next_event(ticket)
        finally:
            if not ended:
                self._withdraw(ticket)


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

    def __init__(self, host: str, port: int, app: ServeApp) -> None:
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
