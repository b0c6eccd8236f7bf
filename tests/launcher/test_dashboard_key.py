"""The dashboard of `serve --api-key` in a real headless Chromium: /v1/cluster/state and
/v1/cluster/stream answer 401 without the key (and /health and /metrics keep needing none),
the page asks for the key once and then works, chat included; the key never appears in what
the endpoints return."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, console_errors, text, wait_for
from launch_helpers import tiny_model
from serve_helpers import Server, serving

__all__ = ["tiny_model"]  # the fixture

KEY = "dashboard-test-key-7f3a"


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with serving("--local", "1", "--model", str(tiny_model), "--api-key", KEY) as s:
        s.wait_ready()
        yield s


def _get(s: Server, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        answer = conn.getresponse()
        body = answer.read1(65536) if path.endswith("/stream") else answer.read()
        return answer.status, body
    finally:
        conn.close()


def test_state_and_stream_need_the_key_health_and_metrics_do_not(server: Server) -> None:
    for path in ("/v1/cluster/state", "/v1/cluster/stream"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
            status, body = _get(server, path, headers)
            assert status == 401, (path, headers)
            assert json.loads(body)["error"]["code"] == "invalid_api_key"
        status, body = _get(server, path, {"Authorization": f"Bearer {KEY}"})
        assert status == 200 and KEY.encode() not in body, path
        assert _get(server, path, {"x-api-key": KEY})[0] == 200
    assert _get(server, "/health")[0] == 200
    assert _get(server, "/metrics")[0] == 200
    assert _get(server, "/")[0] == 200  # the page holds no data: it asks for the key


def test_the_page_asks_for_the_key_once_then_works(server: Server) -> None:
    with chromium() as page:
        page.get(f"http://127.0.0.1:{server.port}/")
        form = wait_for(
            "the key form", lambda: page.find_element("id", "key-form").is_displayed(), 20
        )
        assert form and text(page, "status") == "unauthorized"
        console_errors(page)  # the 401 that made the page ask is expected
        page.find_element("id", "key-input").send_keys("not-the-key\n")
        wait_for("the wrong key refused", lambda: "refused" in text(page, "key-error"), 20)
        key_input = page.find_element("id", "key-input")
        key_input.clear()
        key_input.send_keys(KEY + "\n")
        wait_for("status ready", lambda: text(page, "status") == "ready", 30)
        assert not page.find_element("id", "key-form").is_displayed()
        assert "localhost" in page.find_element("css selector", "#wiring table").text
        errors = console_errors(page)  # only the refused key, if its 401 was logged late
        assert all("401" in e for e in errors), errors
        # The stream works with the key: the page keeps updating.
        first = page.find_element("tag name", "body").get_attribute("data-updated")
        wait_for("a streamed update", lambda: page.find_element("tag name", "body")
                 .get_attribute("data-updated") != first, 10)  # fmt: skip
        # Chat sends the key too.
        page.find_element("id", "chat-input").send_keys("Hello")
        page.find_element("id", "chat-send").click()
        answer = wait_for("an answer", lambda: page.find_element(
            "css selector", "#chat-log .msg.assistant[data-done]"), 120)  # fmt: skip
        assert answer.get_attribute("data-done") == "1", answer.text
        # A reload asks no more: the key is kept for this tab.
        page.refresh()
        wait_for("ready after a reload", lambda: text(page, "status") == "ready", 30)
        assert not page.find_element("id", "key-form").is_displayed()
        assert KEY not in page.find_element("tag name", "body").text
        html: Any = page.page_source
        assert not re.search(re.escape(KEY), html)
