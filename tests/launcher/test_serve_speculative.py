"""Speculation through the real server and the official `openai` client, default flags: a
request's `prediction` (OpenAI's Predicted Outputs) drafts tokens without changing the answer,
usage reports the accepted and rejected prediction tokens, /metrics counts drafts, and a
prediction that is not text is a 400 naming the field while serving goes on."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_helpers import tiny_model
from serve_helpers import Server, serving

__all__ = ["tiny_model"]  # the fixture

QUESTION = [{"role": "user", "content": "Repeat after me: the sea and the mountains"}]


@pytest.fixture(scope="module")
def servers(tiny_model: Path) -> Iterator[tuple[Server, Server]]:
    """The same model served with the default flags and with --speculative off."""
    with (
        serving("--local", "2", "--model", str(tiny_model)) as on,
        serving("--local", "1", "--model", str(tiny_model), "--speculative", "off") as off,
    ):
        on.wait_ready()
        off.wait_ready()
        yield on, off


def _chat(s: Server, **extra: object) -> tuple[str, dict[str, object]]:
    out = s.client().chat.completions.create(
        model="m", messages=QUESTION, max_tokens=40, temperature=0, **extra
    )
    assert out.usage is not None
    return out.choices[0].message.content or "", out.usage.model_dump()


def test_a_prediction_drafts_without_changing_the_answer(servers: tuple[Server, Server]) -> None:
    on, off = servers
    plain, plain_usage = _chat(off)
    assert (
        "completion_tokens_details" not in plain_usage
        or not plain_usage["completion_tokens_details"]
    )
    for prediction in (plain, plain[: len(plain) // 2] + "something else entirely"):
        text, usage = _chat(on, prediction={"type": "content", "content": prediction})
        assert text == plain
        details = usage["completion_tokens_details"]
        assert isinstance(details, dict)
        assert details["accepted_prediction_tokens"] > 0, usage
        spec = usage["speculative"]
        assert isinstance(spec, dict) and spec["drafted_tokens"] >= spec["accepted_tokens"] > 0
    # As text parts, streamed, on /v1/completions: the same text again.
    parts = [{"type": "text", "text": plain[:5]}, {"type": "text", "text": plain[5:]}]
    stream = on.client().chat.completions.create(
        model="m",
        messages=QUESTION,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        prediction={"type": "content", "content": parts},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert (usage.completion_tokens_details.accepted_prediction_tokens or 0) > 0
    want = off.client().completions.create(model="m", prompt="abc", max_tokens=20, temperature=0)
    got = on.client().completions.create(
        model="m",
        prompt="abc",
        max_tokens=20,
        temperature=0,
        extra_body={"prediction": {"type": "content", "content": want.choices[0].text}},
    )
    assert got.choices[0].text == want.choices[0].text


@pytest.mark.parametrize(
    "prediction",
    [
        "just a string",
        {"type": "content"},
        {"type": "other", "content": "x"},
        {"type": "content", "content": 5},
        {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"type": "content", "content": [{"type": "text"}]},
    ],
)
def test_a_prediction_that_is_not_text_is_a_400(
    servers: tuple[Server, Server], prediction: object
) -> None:
    on, _ = servers
    body = {"messages": QUESTION, "max_tokens": 4, "prediction": prediction}
    status, answer = on.request("POST", "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400, answer
    assert str(answer["error"]["param"]).startswith("prediction"), answer
    assert on.health()[0] == 200


def test_metrics_count_drafts(servers: tuple[Server, Server]) -> None:
    on, _ = servers
    text, _ = _chat(on)
    _chat(on, prediction={"type": "content", "content": text})
    values = _metrics(on)
    assert values["mlx_cluster_drafted_tokens_total"] > 0
    assert (
        0
        < values["mlx_cluster_accepted_draft_tokens_total"]
        <= values["mlx_cluster_drafted_tokens_total"]
    )
    assert values["mlx_cluster_draft_checks_total"] > 0


def _metrics(s: Server) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    conn.request("GET", "/metrics")
    scraped = conn.getresponse().read().decode()
    conn.close()
    return {
        line.split()[0]: float(line.split()[1])
        for line in scraped.splitlines()
        if line.startswith("mlx_cluster_") and " " in line
    }


def test_with_nothing_to_copy_answers_are_offs_and_few_forwards_check(
    servers: tuple[Server, Server],
) -> None:
    """8 clients sampling at a high temperature, nothing to copy: seeded answers are exactly
    --speculative off's and hardly a forward checks a draft (tests/cluster/test_check_width.py
    drives the engine with drafts that never hold; the dashboard test sees the width rank 0
    chose from its measured costs)."""
    on, off = servers
    before = _metrics(on)
    prompt = "one two three four five six " * 12

    def run(s: Server) -> list[str]:
        texts = [""] * 8

        def one(i: int) -> None:
            out = s.client().completions.create(
                model="m", prompt=prompt, max_tokens=80, temperature=1.5, seed=i
            )
            texts[i] = out.choices[0].text

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return texts

    assert run(on) == run(off)
    after = _metrics(on)
    generated = after["mlx_cluster_generated_tokens_total"] - before.get(
        "mlx_cluster_generated_tokens_total", 0.0
    )
    checks = after["mlx_cluster_draft_checks_total"] - before["mlx_cluster_draft_checks_total"]
    assert generated >= 8 * 40
    # a check counts once per sequence whose draft it read: 8 rows x 80 tokens of plain steps
    # would be 640 such chances
    assert checks <= 0.1 * generated, (checks, generated)
