"""Serve-mode ranks driven through rank 0's stdin, as the launcher drives them, and the
single-process mlx-lm references their answers are compared with."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rankrun import Ranks, ring_jobs

DONE_TIMEOUT_S = 180


class ServeRanks:
    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.rank0 = ranks.ranks[0]

    def send(self, request_id: str, ids: list[int], max_tokens: int = 12, **fields: Any) -> None:
        line = {"id": request_id, "prompt_ids": ids, "max_tokens": max_tokens, "temperature": 0.0}
        self.line({"top_p": 1.0, "seed": 0, **line, **fields})

    def line(self, body: dict[str, Any]) -> None:
        stdin = self.rank0.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(body) + "\n")
        stdin.flush()

    def all_events(self) -> list[dict[str, Any]]:
        """Rank 0's events in order, a step's `batch` line unpacked."""
        out: list[dict[str, Any]] = []
        for e in list(self.rank0.events):
            out.extend(e["events"] if e["event"] == "batch" else [e])
        return out

    def events(self, name: str, request_id: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.all_events()
            if e["event"] == name and (request_id is None or e.get("id") == request_id)
        ]

    def failed(self) -> list[dict[str, Any]]:
        return [e for r in self.ranks.ranks for e in list(r.events) if e["event"] == "error"]

    def wait_for_events(self, name: str, request_id: str, count: int = 1) -> list[dict[str, Any]]:
        done = self.ranks.wait_for(
            lambda: len(self.events(name, request_id)) >= count or bool(self.failed()),
            DONE_TIMEOUT_S,
        )
        assert done and not self.failed(), (self.failed(), [r.stderr for r in self.ranks.ranks])
        return self.events(name, request_id)

    def done(self, request_id: str) -> dict[str, Any]:
        return self.wait_for_events("done", request_id)[0]


@contextmanager
def serving(
    model: Path,
    n: int,
    strategy: str,
    early: list[dict[str, Any]] = (),
    shares: list[dict[str, Any]] | None = None,
    **options: Any,
) -> Iterator[ServeRanks]:
    """n serve-mode ranks; `early` request lines reach rank 0 before it has loaded, so its
    first decision admits them together (a static batch). `shares`: tensor shares as a plan
    hands them to the jobs (else each rank takes its own)."""
    jobs = ring_jobs(n, model, strategy=strategy, mode="serve", options=options)
    if shares is not None:
        jobs = [
            replace(job, tensor_share=share, tensor_layout=shares)
            for job, share in zip(jobs, shares, strict=True)
        ]
    ranks = Ranks(jobs)
    served = ServeRanks(ranks)
    for body in early:
        served.line(body)
    try:
        yield served
    finally:
        ranks.kill()


def request(request_id: str, ids: list[int], max_tokens: int = 12) -> dict[str, Any]:
    return {
        "id": request_id,
        "prompt_ids": ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": 0,
    }


def batch_reference(model_dir: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """mlx-lm's own batch_generate in this process, greedy."""
    from mlx_lm import load
    from mlx_lm.generate import batch_generate

    model, tokenizer = load(str(model_dir))
    out = batch_generate(model, tokenizer, prompts, max_tokens=max_tokens, return_token_ids=True)
    assert out.token_ids is not None
    return [list(t) for t in out.token_ids]


def logit_gap(model_dir: Path, prefix: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| for the token after `prefix`, one process, no batch."""
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(str(model_dir))
    logits = model(mx.array([prefix]))[0, -1]
    return abs(float(logits[a]) - float(logits[b]))
