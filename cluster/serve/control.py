"""The step message rank 0 shares with every rank, and the collective that carries it.

Every rank of a serving job runs the same scheduler step: rank 0 decides which requests join the
batch, which leave it, how large the next prompt chunk is and how many steps run before the next
decision (a lease), and shares that in one collective. Steps inside a lease cost no collective of
their own: nothing changes there that every rank does not already know.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

# One all_sum of this many int32 words carries a message of up to 1,020 bytes (a lease renewal,
# a cancel, a short prompt); a longer one takes a second all_sum for the rest. Small collectives
# cost their latency, not their size, so the first one is sized to hold most messages.
CONTROL_WORDS = 256
HEAD_BYTES = (CONTROL_WORDS - 1) * 4


@dataclass(frozen=True)
class Sampling:
    """How one sequence picks its tokens; every rank builds the same sampler and processors."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 0.0  # 0: off (1 would be neutral)
    logit_bias: dict[str, float] = field(default_factory=dict)  # token id (as text) -> bias
    grammar: str | None = None  # llguidance grammar the output must follow


@dataclass(frozen=True)
class Admit:
    """One sequence joining the batch, as every rank needs it."""

    ids: list[int]  # prompt tokens after the reused prefix
    max_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    entry: int | None = None  # prefix-cache entry to start from
    reuse: int = 0  # how many of that entry's tokens to keep
    share_prompt: bool = False  # cache the prompt once read, however short (n > 1 choices)
    prediction: list[int] | None = None  # the client's predicted output (a draft source)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Admit:
        return cls(**{**raw, "sampling": Sampling(**raw.get("sampling", {}))})


@dataclass(frozen=True)
class Step:
    steps: int = 0  # decode/prefill steps to run before the next decision
    chunk: int = 0  # prompt tokens per sequence per step (0: keep the current size)
    add: list[Admit] = field(default_factory=list)
    remove: list[int] = field(default_factory=list)  # batch uids that leave now
    # The prefix cache's bound from now on, in tokens (None: unchanged): it shrinks to lend its
    # share to running sequences, and every rank evicts the same entries here.
    cache_tokens: int | None = None
    # Drafted tokens a checking forward reads per sequence from now on (None: unchanged; 0:
    # plain steps): rank 0 chooses it from measured step costs (speculative/check_width.py).
    draft_width: int | None = None

    def encode(self) -> bytes:
        raw: dict[str, Any] = {k: v for k, v in asdict(self).items() if v}
        for name in ("cache_tokens", "draft_width"):
            if getattr(self, name) is not None:
                raw[name] = getattr(self, name)  # 0 too
        return json.dumps(raw, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Step:
        raw = json.loads(data) if data else {}
        return cls(
            steps=int(raw.get("steps", 0)),
            chunk=int(raw.get("chunk", 0)),
            add=[Admit.from_json(a) for a in raw.get("add", [])],
            remove=[int(u) for u in raw.get("remove", [])],
            cache_tokens=None if raw.get("cache_tokens") is None else int(raw["cache_tokens"]),
            draft_width=None if raw.get("draft_width") is None else int(raw["draft_width"]),
        )


def _words(data: bytes, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int32)
    if data:
        padded = data.ljust(-(-len(data) // 4) * 4, b"\0")
        out[: len(padded) // 4] = np.frombuffer(padded, dtype=np.int32)
    return out


def share(payload: bytes | None, group: Any, stream: Any) -> bytes:
    """Rank 0's payload on every rank (the others pass None). Sums of int32 are exact on every
    backend. The collective runs on `stream`, the one the batch's forward passes run on, so it
    pairs up with the same collective on every rank, after the same forward passes."""
    if group is None:
        return payload or b""
    mine = (payload or b"") if group.rank() == 0 else b""
    head = np.zeros(CONTROL_WORDS, dtype=np.int32)
    head[0] = len(mine)
    head[1:] = _words(mine[:HEAD_BYTES], CONTROL_WORDS - 1)
    total = np.asarray(mx.distributed.all_sum(mx.array(head), group=group, stream=stream))
    length = int(total[0])
    data = total[1:].astype(np.int32).tobytes()[: min(length, HEAD_BYTES)]
    if length > HEAD_BYTES:
        rest_words = -(-(length - HEAD_BYTES) // 4)
        rest = _words(mine[HEAD_BYTES:], rest_words)
        summed = mx.distributed.all_sum(mx.array(rest), group=group, stream=stream)
        data += np.asarray(summed).astype(np.int32).tobytes()[: length - HEAD_BYTES]
    return data
