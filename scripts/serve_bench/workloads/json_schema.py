"""Constrained decoding's cost, ours only (mlx-lm's server has no response_format): the plain
rounds' requests with a json_schema response_format, at 1 and 8 clients, in a table of its own
next to our plain figures. Bounded fields, so a random model can finish the object within
--max-tokens."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ..text import ratio_row
from .rounds import METRICS, RoundKind, clients_label

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 40},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"enum": ["sea", "mountain", "city"]}, "maxItems": 3},
    },
    "required": ["answer", "confidence", "tags"],
    "additionalProperties": False,
}
JSON_KWARGS = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
    }
}


@dataclass(frozen=True)
class OursAgainstPlain(RoundKind):
    """A kind only ours runs: its tok/s and time per output token next to our plain rounds'."""

    def tables(self, summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
        lines = ["", "| ours: constrained decoding | json_schema | plain | json / plain |"]
        lines.append("|---|---:|---:|---:|")
        for metric, text, scale, spec in (METRICS[0], METRICS[5]):
            for c in self.levels(args):
                plain = summary["rounds"].get(f"plain/c{c}", {}).get("mlx-cluster", {})
                mine = summary["rounds"][f"{self.name}/c{c}"]["mlx-cluster"]
                label = clients_label(text, c)
                lines.append(ratio_row(label, mine[metric], plain.get(metric), scale, spec))
        return lines


JSON_SCHEMA = OursAgainstPlain(
    "json_schema", JSON_KWARGS, servers=("mlx-cluster",), concurrency=(1, 8)
)
