"""Every HTTP error of `mlx-cluster serve` as its route's API's error object, with its status:
Anthropic's under /v1/messages, OpenAI's elsewhere. Starlette's own 404 / 405 and any exception
nobody expected are answered the same way, so a client never sees a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from launcher.serve import anthropic_api
from launcher.serve.request_api import ApiError

ANTHROPIC_ROUTES = "/v1/messages"  # and everything under it
GONE_STATUS = 499  # what /metrics counts for a client that left before its answer (nginx's)


def _is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_ROUTES or path.startswith(ANTHROPIC_ROUTES + "/")


def error_body(e: ApiError, path: str) -> dict[str, Any]:
    """The error object `path`'s API answers with (also a stream's last event)."""
    return anthropic_api.error_body(e) if _is_anthropic(path) else e.body()


def error_response(e: ApiError, path: str) -> JSONResponse:
    headers = {"Connection": "close"} if e.status in (411, 413) else None  # body left unread
    return JSONResponse(error_body(e, path), status_code=e.status, headers=headers)


async def _api_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, ApiError)
    return error_response(e, request.url.path)


async def _http_error(request: Request, e: Exception) -> Response:
    """Starlette's own 404 / 405, as the route's API's error objects."""
    assert isinstance(e, HTTPException)
    method, path = request.method, request.url.path.rstrip("/") or "/"
    if e.status_code == 405:
        allow = (e.headers or {}).get("Allow", "")
        takes = allow.split(",")[0].strip()  # GET routes also take HEAD: name the first
        message = f"{path} takes {takes}, not {method}"
        answer = error_response(ApiError(405, message, code="method_not_allowed"), path)
        answer.headers["Allow"] = allow
        return answer
    if e.status_code == 404:
        error = ApiError(404, f"no route for {method} {path}", code="not_found")
        return error_response(error, path)
    return error_response(ApiError(e.status_code, str(e.detail)), path)


async def _internal_error(request: Request, e: Exception) -> Response:
    message = f"internal error: {type(e).__name__}: {e}"
    error = ApiError(500, message, "server_error", code="internal_error")
    return error_response(error, request.url.path)


def exception_handlers() -> dict[Any, Callable[[Request, Exception], Any]]:
    """Starlette's exception_handlers: ApiError, Starlette's HTTPException, anything else."""
    return {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}
