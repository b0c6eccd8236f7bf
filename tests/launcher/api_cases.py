"""Tools, schemas and messages the API tests share (OpenAI's and Anthropic's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from serve_helpers import Server, serving

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "add", "parameters": ADD},
    },
]
ANTHROPIC_TOOLS: Any = [{"name": "add", "description": "Adds two integers", "input_schema": ADD}]
USER: Any = [{"role": "user", "content": "Hello world"}]


def keyed_server(model: Path, key: str) -> Iterator[Server]:
    """`serve --local 2` with an API key, for a module's tests; no traceback in its log."""
    with serving("--local", "2", "--model", str(model), "--api-key", key) as s:
        s.wait_ready()
        yield s
        assert "Traceback" not in s.stderr, s.stderr
