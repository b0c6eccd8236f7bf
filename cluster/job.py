"""The contract between the launcher and a rank: the job it runs and the events it reports.

A rank is started as `python -m cluster.rank` with nothing else on its command line (so no
value ever passes through a shell). The launcher writes the job as one JSON line on the rank's
stdin and keeps stdin open: EOF on stdin means the launcher is gone and the rank must exit.
The rank reports progress as event lines on stderr (`EVENT_PREFIX` + JSON); rank 0 streams the
generated text on stdout. This module imports no MLX so the launcher can use it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

EVENT_PREFIX = "@mlx-cluster "


@dataclass(frozen=True)
class RankJob:
    rank: int
    world_size: int
    backend: str  # "ring" | "jaccl" | "jaccl-ring" (ignored when world_size == 1)
    strategy: str  # "tensor" | "pipeline"
    model: str  # local directory or Hugging Face repo id
    # pipeline: layers per rank in mlx-lm's order (rank 0 holds the LAST layers); None = even
    layer_split: tuple[int, ...] | None = None
    # tensor: this rank's heads and widths (topology/planning/tensor_shares.py); None = equal
    tensor_share: dict[str, Any] | None = None
    # every rank's share, rank by rank: checked to hold each head and column exactly once
    tensor_layout: list[dict[str, Any]] | None = None
    prompt: str = ""
    max_tokens: int = 100
    temp: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    use_chat_template: bool = True
    # Environment the rank sets before importing mlx (MLX_RANK, MLX_JACCL_COORDINATOR, ...).
    env: dict[str, str] = field(default_factory=dict)
    # Files the rank writes to a private temp dir; each name is an env var set to its path
    # (MLX_HOSTFILE, MLX_IBV_DEVICES), as mlx.launch does.
    files: dict[str, str] = field(default_factory=dict)
    heartbeat_s: float = 1.0  # how often the rank says it is alive
    # The rank's own deadline (0 = off), enforced by cluster/rank_guard.py outside the GIL: the
    # launcher writes an empty line every second; a rank that stops getting them for this long
    # is cut off from the launcher and stops itself rather than hold the model's memory.
    orphan_timeout_s: float = 0.0
    # The links this rank's guard heartbeats (its collectives' peers): cluster/rank_guard.py.
    links: list[dict[str, Any]] = field(default_factory=list)
    # Model files this host lacks, and who serves them (launcher/share/offer.py): {"token",
    # "manifest": cluster/files/manifest.py's JSON, "revision": Hub commit|None, "sources":
    # [{"urls": [base URL, fastest first], "files": [name]}], "serve"?: {"port", "addresses",
    # "files"}}.
    share: dict[str, Any] | None = None
    hub: bool = True  # may the rank download from the Hugging Face Hub (`--no-hub`: no)
    mode: str = "generate"  # "generate" | "serve" | "bench"
    options: dict[str, Any] = field(default_factory=dict)  # mode-specific settings

    def to_line(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> RankJob:
        raw = json.loads(line)
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(
                f"unknown job fields {sorted(unknown)}: launcher and rank versions differ"
            )
        if raw.get("layer_split") is not None:
            raw["layer_split"] = tuple(raw["layer_split"])
        return cls(**raw)


def event_line(event: str, **data: Any) -> str:
    """One stderr line the launcher recognises: `@mlx-cluster {"event": ..., ...}`."""
    return EVENT_PREFIX + json.dumps({"event": event, **data}, separators=(",", ":")) + "\n"


def parse_event(line: str) -> dict[str, Any] | None:
    """The event in a stderr line, or None for ordinary output."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        value = json.loads(line[len(EVENT_PREFIX) :])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and "event" in value else None
