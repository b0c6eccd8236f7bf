"""`mlx-cluster serve`'s HTTP side: admission (429 only beyond --max-concurrency + --max-queue),
clients that disconnect (their requests are withdrawn at once), the body and route rules through
raw sockets, and the tickets' bridge from supervisor threads to the event loop.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from launch_helpers import tiny_model
from serve_helpers import Server, StreamInBackground, serving

from launcher.serve.tickets import Busy, Tickets

__all__ = ["tiny_model"]  # the fixture

KEY = "http-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
PROMPT = "Hello world"
TOKEN_DELAY_S = 0.05  # every decode step: a 400-token answer would take 20 s
AT_ONCE_S = 2.0  # a withdrawn request leaves /health's count within this


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    args = ["--local", "1", "--model", str(tiny_model), "--api-key", KEY]
    args += ["--max-concurrency", "1", "--max-queue", "1"]
    args += ["--job-option", f"token_delay_s={TOKEN_DELAY_S}"]
    with serving(*args) as s:
        s.wait_ready()
        yield s
        assert "Traceback" not in s.stderr and "error" not in s.stderr, s.stderr


def _chat(max_tokens: int, stream: bool) -> bytes:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    return json.dumps(body).encode()


def _raw_post(s: Server, body: bytes) -> socket.socket:
    """A request sent on a plain socket that the test can drop at any moment."""
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_429_only_beyond_running_plus_queued(server: Server) -> None:
    """--max-concurrency 1 --max-queue 1: one decodes, one waits on rank 0, the third is 429."""
    client = server.client(KEY)
    decoding = StreamInBackground(client, max_tokens=80)
    assert decoding.started.wait(60), server.stderr
    waiting = StreamInBackground(client, max_tokens=4)
    server.wait_open(2, 10)
    status, body = server.request("POST", "/v1/chat/completions", _chat(2, False), AUTH)
    assert status == 429, body
    error = body["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "too_many_requests")
    assert "--max-queue 1" in error["message"]
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="m", prompt=PROMPT, max_tokens=2)
    for stream in (decoding, waiting):
        stream.thread.join(60)
        assert stream.error is None and stream.text, stream.error
    server.wait_open(0, 10)
    assert server.client(KEY).completions.create(model="m", prompt=PROMPT, max_tokens=2).choices


def test_stream_closed_midway_is_withdrawn_at_once(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", _chat(400, True), AUTH)
    response = conn.getresponse()
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    while b'"content"' not in (line := response.readline()):  # the first text
        assert line, "the stream ended before any text"
    assert server.health()[1]["open_requests"] == 1
    conn.close()  # the client goes away mid-stream
    assert server.wait_open(0, AT_ONCE_S) < AT_ONCE_S
    out = server.client(KEY).completions.create(model="m", prompt=PROMPT, max_tokens=2)
    assert out.choices[0].finish_reason in ("length", "stop")


def test_unstreamed_request_whose_client_leaves_is_withdrawn(server: Server) -> None:
    sock = _raw_post(server, _chat(400, False))
    server.wait_open(1, 10)
    time.sleep(0.5)  # decoding by now
    sock.close()
    assert server.wait_open(0, AT_ONCE_S) < AT_ONCE_S


def test_request_waiting_in_the_queue_whose_client_leaves(server: Server) -> None:
    decoding = StreamInBackground(server.client(KEY), max_tokens=120)
    assert decoding.started.wait(60), server.stderr
    queued = _raw_post(server, _chat(400, True))
    server.wait_open(2, 10)
    queued.close()  # before rank 0 ever took it
    server.wait_open(1, AT_ONCE_S)
    decoding.thread.join(60)
    assert decoding.error is None and decoding.text


def _status_of(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, Any]]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, dict(response.headers), json.loads(response.read())


def test_body_rules_411_and_413(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n"
        )
        status, _, body = _status_of(sock)
        assert (status, body["error"]["code"]) == (411, "length_required")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(  # announced, never sent: refused before reading it
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 17000000\r\n\r\n"
        )
        status, headers, body = _status_of(sock)
        assert status == 413 and "16 MiB" in body["error"]["message"]
        assert headers.get("connection") == "close"


def test_routes_keys_and_methods(server: Server, tiny_model: Path) -> None:
    key = {"Authorization": f"Bearer {KEY}"}
    assert server.request("GET", f"/v1/models/{tiny_model}", headers=key)[1]["id"] == str(
        tiny_model
    )
    status, body = server.request("GET", "/v1/models/other-model", headers=key)
    assert (status, body["error"]["code"]) == (404, "model_not_found")
    assert server.request("GET", f"/v1/models/{tiny_model}")[0] == 401
    assert server.request("GET", "/v1/models/", headers=key)[1]["object"] == "list"
    status, body = server.request("POST", "/health", b"{}")
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")
    status, body = server.request("DELETE", "/v1/completions", headers=key)
    assert status == 405 and "takes POST" in body["error"]["message"]
    status, body = server.request("POST", "/nowhere", b"{}", key)
    assert (status, body["error"]["code"]) == (404, "not_found")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics")  # no key, like /health
    assert conn.getresponse().status == 200
    conn.close()
    # The scheme is case-insensitive (RFC 9110); a method nobody knows is a JSON 405.
    lower = {"Authorization": f"bearer {KEY}"}
    assert server.request("GET", "/v1/models", headers=lower)[1]["object"] == "list"
    status, body = server.request("BREW", "/v1/models", headers=key)
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")


def test_a_client_gone_mid_error_leaves_no_trace(server: Server) -> None:
    """A bad request whose client closes before reading the 400: nothing in the log (the module
    fixture asserts no traceback and no error line at the end)."""
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        body = b"{" * 5000
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # RST: the answer's write finds the connection gone
    assert server.health()[0] == 200


def test_tickets_carry_events_from_other_threads_to_the_loop() -> None:
    """The bridge itself: route() on a plain thread, next_event() on the loop; the silence
    bound ends a begun ticket; beyond max_open, Busy."""

    async def main() -> list[str]:
        tickets = Tickets(2)
        loop = asyncio.get_running_loop()
        first, second = tickets.open("a", loop), tickets.open("b", loop)
        with pytest.raises(Busy):
            tickets.open("c", loop)
        events = [
            {"event": "begin", "id": "a", "prompt_tokens": 3, "cached_tokens": 0},
            {"event": "delta", "id": "a", "text": "x"},
            {"event": "begin", "id": "b"},
            {"event": "done", "id": "a", "finish_reason": "stop"},
            {"event": "delta", "id": "nobody", "text": "ignored"},
        ]
        sender = threading.Thread(target=lambda: [tickets.route(e) for e in events])
        sender.start()
        got = [(await tickets.next_event(first, 5.0))["event"] for _ in range(3)]
        assert len(tickets) == 1 and "a" not in tickets  # done ended it
        assert (await tickets.next_event(second, 5.0))["event"] == "begin"
        silent = await tickets.next_event(second, 0.2)  # begun, then nothing
        assert silent["event"] == "failed" and len(tickets) == 0
        sender.join()
        return got

    assert asyncio.run(main()) == ["begin", "delta", "done"]
