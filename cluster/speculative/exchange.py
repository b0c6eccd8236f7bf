"""Rank 0's drafts handed to every rank, when a draft model makes them (only rank 0 loads it).

One collective per drafting step, on the stream of the batch's forwards and at the same steps on
every rank (whether a step drafts follows from token outcomes alone), so it pairs up like the
step messages it rides beside. On a Mac cluster it costs one small all_sum (tens of
microseconds over RDMA) per check of several tokens."""

from __future__ import annotations

import json
from typing import Any

from cluster.serve.control import share
from cluster.speculative.draft_model import load_drafter
from cluster.speculative.drafts import Drafts, Exchange


def draft_exchange(group: Any, stream: Any) -> Exchange:
    def exchange(drafts: list[list[int]] | None) -> list[list[int]]:
        payload = None if drafts is None else json.dumps(drafts, separators=(",", ":")).encode()
        got = json.loads(share(payload, group, stream) or b"[]")
        return [[int(t) for t in row] for row in got]

    return exchange


def job_drafts(options: dict[str, Any], rank: int, group: Any, stream: Any) -> Drafts | None:
    """With `draft_model` in the job's options: rank 0 loads it and every rank gets rank 0's
    drafts; otherwise None (prompt lookup and predictions alone, made on every rank)."""
    name = options.get("draft_model")
    if not name:
        return None
    drafter = load_drafter(str(name)) if rank == 0 else None
    return Drafts(drafter, draft_exchange(group, stream))
