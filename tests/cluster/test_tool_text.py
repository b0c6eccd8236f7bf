"""Tool calls cut out of streamed text (cluster/serve/output.py's ToolCallText): markers split
across pieces, text around calls, several calls, and an unfinished call given back as text."""

from __future__ import annotations

import pytest

from cluster.serve.output import ToolCallText

CALL = '{"name": "f", "arguments": {"x": 1}}'
TEXT = f"Sure.<tool_call>\n{CALL}\n</tool_call>\n<tool_call>{CALL}</tool_call> done"


def feed_all(pieces: list[str]) -> tuple[str, list[str]]:
    t = ToolCallText("<tool_call>", "</tool_call>")
    plain, calls = "", []
    for p in pieces:
        text, ended = t.feed(p)
        plain, calls = plain + text, calls + ended
    return plain + t.flush(), calls


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(TEXT)])
def test_calls_come_out_whole_however_the_text_is_cut(size: int) -> None:
    plain, calls = feed_all([TEXT[i : i + size] for i in range(0, len(TEXT), size)])
    assert plain == "Sure.\n done"
    assert [c.strip() for c in calls] == [CALL, CALL]


def test_text_that_only_looks_like_a_marker_is_text() -> None:
    assert feed_all(["a <tool", "_cal", "x> b"]) == ("a <tool_calx> b", [])


def test_an_unfinished_call_is_text_at_the_end() -> None:
    assert feed_all(["hi <tool_call>{", '"name"']) == ('hi <tool_call>{"name"', [])
