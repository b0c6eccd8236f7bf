"""The dashboard of a real `serve --local 2` (default flags) in a real headless Chromium: the
page loads without a console error and shows the host, the plan and the counters; they and the
charts move while requests run and end equal to /metrics; the chat streams an answer; a killed
rank shows up as a failover and the same page follows the re-plan. One server and one browser
serve the whole module (2 cores); the tests run in file order, the kill last."""

from __future__ import annotations

import contextlib
import http.client
import importlib.metadata
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from browser import chromium, console_errors, screenshot, text, wait_for
from launch_helpers import tiny_model
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import Server, serving

__all__ = ["tiny_model"]  # the fixture

STATE_KEYS = {"hosts", "links", "problems", "plan", "serving", "events"}
PAGE_TIMEOUT_S = 30.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with serving("--local", "2", "--model", str(tiny_model)) as s:
        s.wait_ready()
        yield s


@pytest.fixture(scope="module")
def page(server: Server) -> Iterator[Any]:
    with chromium() as driver:
        driver.get(f"http://127.0.0.1:{server.port}/")
        yield driver


def _get(s: Server, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def _stream_frames(s: Server, seconds: float) -> list[dict[str, Any]]:
    """The `state` events /v1/cluster/stream sends within `seconds`."""
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request("GET", "/v1/cluster/stream")
    answer = conn.getresponse()
    assert answer.status == 200 and answer.getheader("Content-Type", "").startswith(
        "text/event-stream"
    )
    frames, buffer, end = [], b"", time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            buffer += answer.read1(65536)
            while b"\n\n" in buffer:
                frame, buffer = buffer.split(b"\n\n", 1)
                data = [line[5:] for line in frame.split(b"\n") if line.startswith(b"data:")]
                if b"event: state" in frame and data:
                    frames.append(json.loads(b"\n".join(data)))
    finally:
        conn.close()
    return frames


def _wait_running(s: Server, seconds: float) -> None:
    """Until the state says a request runs."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if json.loads(_get(s, "/v1/cluster/state")[1])["serving"]["running"] >= 1:
            return
        time.sleep(0.05)
    raise AssertionError(f"no request running after {seconds} s")


def _metric(s: Server, name: str) -> float:
    status, body = _get(s, "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


def _chat(s: Server, max_tokens: int, prompt: str) -> None:
    client = s.client()
    for _ in client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True,
    ):  # fmt: skip
        pass


class Load:
    """`clients` threads sending streamed chats back to back until the block ends (the tiny
    model answers a chat in well under a second here: a page polled at 1 Hz needs a while)."""

    def __init__(self, s: Server, clients: int) -> None:
        self.stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(s, i), daemon=True) for i in range(clients)
        ]

    def _run(self, s: Server, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            _chat(s, 160, f"Hello {i} {n}")
            n += 1

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(120)


def test_state_and_stream_carry_the_contract_and_the_page_loads_nothing_from_outside(
    server: Server,
) -> None:
    status, body = _get(server, "/v1/cluster/state")
    state = json.loads(body)
    assert status == 200 and state.keys() >= STATE_KEYS
    health = server.health()[1]
    assert [h["name"] for h in state["hosts"]] == ["localhost"]
    assert state["hosts"][0]["versions"]["mlx"] == importlib.metadata.version("mlx")
    assert state["plan"]["strategy"] == health["strategy"] and len(state["plan"]["ranks"]) == 2
    assert state["serving"]["status"] == "ready"
    # While requests run the stream sends the object at least once a second.
    with Load(server, 2):
        _wait_running(server, 30)  # a busy machine can take seconds to send the first requests
        frames = _stream_frames(server, 4.0)
    assert len(frames) >= 3, [f["time"] for f in frames]
    assert all(f.keys() >= STATE_KEYS for f in frames)
    assert max(f["serving"]["running"] for f in frames) >= 1
    # Each rank's step time, as that rank measured it (its heartbeat), not rank 0's for all.
    # (a rank's first heartbeat after the load began may come after a frame: the last with both)
    measured = [f for f in frames if all(r["step_s"] is not None for r in f["serving"]["ranks"])]
    assert measured, [f["serving"]["ranks"] for f in frames]
    ranks = measured[-1]["serving"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(0 < r["step_s"] < 10 for r in ranks), ranks
    # The page and its files: same-origin only, no CDN.
    status, html = _get(server, "/")
    assert status == 200
    refs = re.findall(rb'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith((b"/dashboard/", b"data:")) for r in refs), refs
    for ref in refs:
        if ref.startswith(b"/dashboard/"):
            status, content = _get(server, ref.decode())
            assert status == 200 and b"https://" not in content and b"@import" not in content
    assert _get(server, "/dashboard/..%2Fpage.py")[0] == 404
    assert _get(server, "/dashboard/nothing.js")[0] == 404


def _unstale(read: Callable[[], T]) -> T:
    """read(), again while the page redraws an element between finding and reading it (a
    StaleElementReferenceException: the page redraws every second, more often seen on a busy
    machine); any other failure is raised as it is."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(20):
        with contextlib.suppress(StaleElementReferenceException):
            return read()
        time.sleep(0.05)
    return read()


FIGURES = ("fig-running", "fig-queued", "fig-generation-tps", "fig-ttft", "fig-cache")


def test_the_page_shows_the_host_the_plan_and_the_counters(page: Any, server: Server) -> None:
    wait_for("status ready", lambda: text(page, "status") == "ready", PAGE_TIMEOUT_S)
    hosts, summary, backend, ranks, figures = _unstale(
        lambda: (
            page.find_element("css selector", "#wiring table").text,
            text(page, "plan-summary"),
            text(page, "backend-in-use"),
            page.find_element("css selector", "#plan table").text,
            {figure: text(page, figure) for figure in FIGURES},
        )
    )
    assert "localhost" in hosts and importlib.metadata.version("mlx") in hosts
    health = server.health()[1]
    assert f"{health['strategy']} ×2" in summary
    assert backend.startswith("backend in use: ring — --local")
    assert "0 localhost" in ranks and "1 localhost" in ranks
    for figure in FIGURES:
        assert figures[figure], figure
    assert page.find_elements("css selector", "#events li[data-kind=serving]")
    assert console_errors(page) == []


def _number(page: Any, element_id: str) -> float:
    return float(text(page, element_id).split()[0])


def _chart_latest(page: Any, title: str) -> str:
    chart = page.find_element("css selector", f'[data-chart="{title}"] .title')
    return str(chart.text)


def _chart_rose(page: Any, title: str) -> bool:
    """Whether the chart's first line has a point above its baseline (y = 58 of 60)."""
    line = page.find_element("css selector", f'[data-chart="{title}"] polyline')
    ys = [float(p.split(",")[1]) for p in line.get_attribute("points").split()]
    return any(y < 57.5 for y in ys)


def _step_chart(page: Any) -> tuple[str, list[str]]:
    """The step-time chart's text and each of its lines' points, read in one go."""
    steps = page.find_element("css selector", '[data-chart^="step time"]')
    lines = steps.find_elements("css selector", "polyline")
    return str(steps.text), [ln.get_attribute("points") or "" for ln in lines]


def _latest_rate(page: Any) -> float:
    found = re.search(r"g ([\d.]+)", _chart_latest(page, "tokens/s prompt / generation"))
    return float(found.group(1)) if found else 0.0


def test_counters_and_charts_move_while_requests_run(page: Any, server: Server) -> None:
    # the counters are drawn once the first stats arrive (later on a busy machine)
    wait_for("the counters", lambda: bool(page.find_elements("id", "fig-generated")), 30)
    before = _unstale(lambda: _number(page, "fig-generated"))
    with Load(server, 3):
        wait_for("running ≥ 1 on the page", lambda: _number(page, "fig-running") >= 1, 30)
        wait_for("generation tok/s above 0 in its chart", lambda: _latest_rate(page) > 0, 30)
        time.sleep(3)  # a few points in every chart
        screenshot(page)  # README's picture: the dashboard while requests run
    points = _unstale(
        lambda: (
            page.find_element("css selector", '[data-chart^="tokens/s"] polyline')
            .get_attribute("points")
            .split()
        )
    )
    assert len(points) >= 2
    generated = _metric(server, "mlx_cluster_generated_tokens_total")
    assert generated > before
    # The page ends on /metrics' own counters: the same bookkeeping, not a second one.
    wait_for(
        "the page's counter = /metrics'", lambda: _number(page, "fig-generated") == generated, 10
    )
    assert _unstale(lambda: text(page, "fig-ttft")).split()[0] != "–"
    assert "ms" in _unstale(lambda: text(page, "fig-itl"))

    # the plan's decode figure against the measured one, flagged beyond 25 %
    # one script reads the row and its flag: the page redraws every second, never mid-script
    (predicted, _, per_sequence, shown), flagged = page.execute_script(
        "const row = document.querySelector('#plan table:last-of-type tbody tr');"
        "return [[...row.querySelectorAll('td')].map((c) => c.innerText),"
        " document.querySelector('#prediction-error').dataset.flagged];"
    )
    error = (float(predicted) - float(per_sequence)) / float(per_sequence)
    assert flagged == str(abs(error) > 0.25).lower(), shown
    assert shown.startswith(("+", "−")) and " %" in shown
    assert ("off by over 25 %" in shown) == (abs(error) > 0.25)
    for chart in ("requests running / queued", "tokens/s prompt / generation"):
        assert _unstale(lambda c=chart: _chart_rose(page, c)), (
            f"{chart}: every point on the baseline"
        )
    # The draft width rank 0 chose from the step costs it measured, and that cost model: the
    # batch sizes of 1-3 clients alone give the fit its points. The page shows /metrics' own.
    wait_for("a step cost", lambda: "ms/position" in text(page, "fig-step-cost"), 15)
    width = _metric(server, "mlx_cluster_draft_width")
    assert width >= 0, "the costs were measured, so rank 0 chose a width"
    wait_for(
        "the page's width = /metrics'",
        lambda: text(page, "fig-draft-width").split()[0] == f"{width:.0f}",
        10,
    )
    fixed = _metric(server, "mlx_cluster_step_cost_fixed_seconds")
    per_position = _metric(server, "mlx_cluster_step_cost_per_position_seconds")
    assert 0 < fixed + per_position < 10
    # a check's own slope, once checks are measured widely (else the plain steps' slope)
    assert _metric(server, "mlx_cluster_step_cost_check_per_position_seconds") >= per_position
    # The step chart: the batch's p50 and one line per rank, each rank's own step time.
    steps, lines = _unstale(lambda: _step_chart(page))
    assert " r0 " in f" {steps} " and " r1 " in f" {steps} ", steps
    assert len(lines) == 3 and all(lines), lines
    assert console_errors(page) == []


def test_a_chat_message_streams_its_answer_into_the_page(page: Any) -> None:
    page.find_element("id", "chat-input").send_keys("Tell me about clusters")
    page.find_element("id", "chat-send").click()
    seen: set[int] = set()
    end = time.monotonic() + 120
    while True:
        answers = page.find_elements("css selector", "#chat-log .msg.assistant")
        if answers:
            seen.add(len(answers[-1].find_element("css selector", ".text").text))
            if answers[-1].get_attribute("data-done"):
                break
        assert time.monotonic() < end, "no answer"
        time.sleep(0.05)
    assert answers[-1].get_attribute("data-done") == "1", answers[-1].text
    # drawn piece by piece as the stream came (the page counts what it drew; sampling the text
    # from here can miss the pieces of a fast answer)
    pieces = int(answers[-1].get_attribute("data-pieces") or 0)
    assert pieces >= 2, f"the answer came in one piece: {pieces}, seen {seen}"
    stats = answers[-1].find_element("css selector", ".stats").text
    assert re.fullmatch(r"TTFT \d+ ms · [\d.]+ tok/s · \d+ tokens", stats), stats
    assert console_errors(page) == []


def test_a_killed_rank_is_a_failover_event_and_the_page_follows_the_replan(
    page: Any, server: Server
) -> None:
    page.execute_script("window.__samePage = 'yes';")  # gone if the page were reloaded
    os.kill(server.ranks(2)[1], signal.SIGKILL)
    for kind in ("rank_lost", "failover", "plan"):
        wait_for(f"a {kind} event", lambda k=kind: page.find_elements(
            "css selector", f"#events li[data-kind={k}]"), 30)  # fmt: skip
    failure = page.find_element("id", "last-failure")
    page.execute_script("arguments[0].open = true;", failure)
    assert "SIGKILL" in failure.find_element("css selector", "pre").text
    wait_for("ready again as ×1", lambda: "×1" in text(page, "plan-summary")
             and text(page, "status") == "ready", 120)  # fmt: skip
    assert page.execute_script("return window.__samePage;") == "yes"
    assert _unstale(lambda: _number(page, "fig-failovers")) == 1
    newest = _unstale(
        lambda: page.find_element("css selector", "#events li").get_attribute("data-kind")
    )
    assert newest == "serving", "newest first: serving again after the re-plan"
    answered = "#chat-log .msg.assistant[data-done]"
    before = len(page.find_elements("css selector", answered))  # counted here: no other test's
    page.find_element("id", "chat-input").send_keys("Hello again")
    page.find_element("id", "chat-send").click()
    done = wait_for("an answer after the re-plan", lambda: page.find_elements(
        "css selector", answered)[-1:]
        if len(page.find_elements("css selector", answered)) > before
        else None, 120)  # fmt: skip
    assert done[0].get_attribute("data-done") == "1", done[0].text
    assert console_errors(page) == []
