"""Tools, schemas and messages the API tests share (OpenAI's and Anthropic's)."""

from __future__ import annotations

from typing import Any

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
