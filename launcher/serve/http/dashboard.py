"""The dashboard's routes: GET / (the page), GET /dashboard/{file} (its scripts and styles),
GET /v1/cluster/state (one JSON object) and GET /v1/cluster/stream (server-sent events of the
same object). The page and its files hold no data and need no key; the state and the stream
need the API key when serve has one (401 otherwise), checked by app.py's own key check."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from launcher.serve.dashboard.page import FILES, static_file
from launcher.serve.dashboard.state import DashboardState
from launcher.serve.dashboard.stream import state_events
from launcher.serve.request_api import ApiError

GET = ("GET",)
# The page's files change only with the package; the data never goes through a cache.
NO_STORE = {"Cache-Control": "no-store"}


class DashboardRoutes:
    def __init__(self, state: DashboardState, check_key: Callable[[Request], None]) -> None:
        self.state, self._check_key = state, check_key

    def routes(self) -> list[Route]:
        return [
            Route("/", self._page, methods=GET),
            Route("/dashboard/{name}", self._file, methods=GET),
            Route("/v1/cluster/state", self._state, methods=GET),
            Route("/v1/cluster/stream", self._stream, methods=GET),
        ]

    async def _page(self, _request: Request) -> Response:
        return Response(static_file("index.html"), media_type=FILES["index.html"])

    async def _file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in FILES:
            raise ApiError(404, f"no dashboard file {name!r}", code="not_found")
        return Response(static_file(name), media_type=FILES[name])

    async def _state(self, request: Request) -> Response:
        self._check_key(request)
        return JSONResponse(self.state.current(), headers=NO_STORE)

    async def _stream(self, request: Request) -> Response:
        self._check_key(request)
        headers = {**NO_STORE, "X-Accel-Buffering": "no"}  # proxies must not hold events back
        return StreamingResponse(
            state_events(self.state.current), media_type="text/event-stream", headers=headers
        )
