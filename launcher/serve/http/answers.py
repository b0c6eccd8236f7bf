"""The HTTP answer to one generate request (chat, completion, messages, count_tokens).

The request goes to rank 0 as a ticket (cluster.py): 429 when --max-concurrency + --max-queue
are open, 503 while the cluster is not serving. Then either one JSON body once the answer is
done, or server-sent events as rank 0's events arrive, in the request's API's shapes
(openai_bodies.py, anthropic_bodies.py). It waits on an asyncio queue fed by rank 0's events
(tickets.py), never holding a thread; a client that disconnects — mid-stream or while a whole
answer is being made — has its request withdrawn from the ranks (cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive

from launcher.serve.cluster import ServeCluster
from launcher.serve.http.errors import GONE_STATUS, error_body
from launcher.serve.request_api import ApiError, GenerateRequest
from launcher.serve.tickets import Busy, Event, Ticket, Unavailable

T = TypeVar("T")


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


def _ended(event: Event) -> ApiError:
    """The error a request ends with: its own (400 for what it asked, 500 for what failed while
    decoding it, the batch going on) or the cluster's (503: the ranks went down)."""
    message = str(event.get("message"))
    if event.get("event") == "failed":
        return _unavailable(f"the request failed: {message}")
    if event.get("kind") == "input":  # it names what (the context, a schema feature, a template)
        return ApiError(400, message, code=str(event.get("code") or "bad_prompt"))
    return ApiError(500, f"the request failed: {message}", "server_error", code="request_failed")


def _is_end(event: Event) -> bool:
    """Rank 0 refused the request or it failed: no answer follows."""
    return event.get("event") in ("failed", "request_error")


async def _disconnected(receive: Receive) -> None:
    """Returns when the client goes away (the request body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Answerer:
    """Answers generate requests from the cluster's ranks: admission, the whole answer or its
    stream, and withdrawing the request when its client goes away."""

    def __init__(self, cluster: ServeCluster, model_id: str) -> None:
        self.cluster, self.model_id = cluster, model_id

    async def answer(
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
            if _is_end(first):  # a refusal still gets its own status
                raise _ended(first)
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
            if _is_end(event):
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
                if _is_end(event):
                    for frame in answer.failure(error_body(_ended(event), path)):
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
