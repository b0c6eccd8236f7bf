"""The ASGI app of `mlx-cluster serve`: every route in one table, the API key, body limits, and
every answer counted by endpoint and status for /metrics.

Routes: GET /health and GET /metrics (no key needed: for load balancers and scrapers), GET
/openapi.json (the request bodies' schemas, no key needed: openapi.py), GET /v1/models[/{id}],
POST /v1/chat/completions and POST /v1/completions (OpenAI), POST /v1/messages and POST
/v1/messages/count_tokens (Anthropic); the dashboard's GET /,
/dashboard/{file}, /v1/cluster/state and /v1/cluster/stream (dashboard.py). A new route is one
line in ServeApp's table and its handler: a method here, or a module of this package for a group
of routes (answers.py answers the generate routes, dashboard.py the dashboard's). Errors:
errors.py.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from launcher.serve.anthropic_api import parse_count_tokens, parse_messages
from launcher.serve.anthropic_bodies import AnthropicAnswer, CountAnswer
from launcher.serve.cluster import ServeCluster
from launcher.serve.dashboard.state import DashboardState
from launcher.serve.http.answers import Answerer, MakeAnswer
from launcher.serve.http.dashboard import DashboardRoutes
from launcher.serve.http.errors import GONE_STATUS, exception_handlers
from launcher.serve.http.openapi import openapi_json
from launcher.serve.metrics import CONTENT_TYPE, ServeMetrics
from launcher.serve.openai_api import parse_chat, parse_completion
from launcher.serve.openai_bodies import OpenAIAnswer, models_body
from launcher.serve.request_api import ApiError, GenerateRequest

MAX_BODY_BYTES = 16 << 20
GET, POST = ("GET",), ("POST",)  # a route's methods (GET routes take HEAD too)
Log = Callable[[str], None]
Parse = Callable[[bytes], GenerateRequest]  # a body into the request (openai_api, anthropic_api)
Endpoint = Callable[[Request], Awaitable[Response]]


class ServeApp:
    """The ASGI app: routes, key checks and counting; generate requests go to the Answerer."""

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
        self.answerer = Answerer(cluster, model_id)
        self.openapi = openapi_json(api_key is not None)  # made here: never on the event loop
        self.dashboard = DashboardRoutes(
            DashboardState(cluster, metrics, model_id), self._check_key
        )
        routes = [
            *self.dashboard.routes(),
            Route("/health", self._health, methods=GET),
            Route("/metrics", self._metrics, methods=GET),
            Route("/openapi.json", self._openapi, methods=GET),
            Route("/v1/models", self._models, methods=GET),
            Route("/v1/models/{name:path}", self._model, methods=GET),
            Route("/v1/chat/completions", self._generate(parse_chat, OpenAIAnswer), methods=POST),
            Route("/v1/completions", self._generate(parse_completion, OpenAIAnswer), methods=POST),
            Route("/v1/messages", self._generate(parse_messages, AnthropicAnswer), methods=POST),
            Route(
                "/v1/messages/count_tokens",
                self._generate(parse_count_tokens, CountAnswer),
                methods=POST,
            ),
        ]
        self.app: ASGIApp = Starlette(routes=routes, exception_handlers=exception_handlers())

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
        except Exception as e:  # Starlette has answered 500 already (errors.py)
            self.log(f"error answering {scope['method']} {path}: {type(e).__name__}: {e}")
        finally:
            self.metrics.request(path, status)

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

    async def _openapi(self, _request: Request) -> Response:
        return Response(self.openapi, media_type="application/json")

    async def _models(self, request: Request) -> Response:
        self._check_key(request)
        return JSONResponse(models_body(self.model_id, self.created))

    async def _model(self, request: Request) -> Response:
        self._check_key(request)
        name = request.path_params["name"]
        if name != self.model_id:
            raise ApiError(404, f"model {name!r} is not served here", code="model_not_found")
        return JSONResponse(models_body(self.model_id, self.created)["data"][0])

    def _generate(self, parse: Parse, make: MakeAnswer) -> Endpoint:
        """A generate route: the body parsed into the request (400 naming a bad field), then
        answered from the ranks in `make`'s API shapes."""

        async def endpoint(request: Request) -> Response:
            generate = parse(await self._body(request))
            return await self.answerer.answer(request, generate, make)

        return endpoint
