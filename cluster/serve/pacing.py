"""How much one decision covers: the lease (batch steps until the next decision) and the prompt
chunk, both sized from the pace rank 0 measures.

Between two decisions every rank runs `steps` batch steps (a lease) with nothing changing; the
lease is sized from the measured step time so a new request, a cancel or a stop string waits at
most about LEASE_S for the next decision, and it ends early when a slot frees on a known step
(a sequence reaching max_tokens) while requests wait. The prompt chunk is sized the same way, so
a step of prefill takes about PREFILL_TARGET_S and keeps reporting progress however slow the
machine: a long prompt is never mistaken for a hang, and running streams wait at most one chunk.
"""

from __future__ import annotations

from typing import Any

from cluster.serve.engine import PREFILL_BATCH

LEASE_S = 0.25  # the longest a decision waits while the batch runs (mlx-lm: ~0.5 s)
MAX_LEASE_STEPS = 64
PREFILL_TARGET_S = 0.5  # one step of prefill takes about this long
MIN_CHUNK = 16


class Pacing:
    """The batch's measured pace (decode step time, prompt tokens per second) and the lease and
    prompt chunk it gives."""

    def __init__(self, max_chunk: int, prefill_rate: float) -> None:
        self.max_chunk = max_chunk
        self.step_s = 0.0  # recent decode step time (EMA); 0 until measured
        self.prefill_rate = prefill_rate  # prompt tokens per second (EMA; first: the warm-up)
        # uid -> prompt tokens read so far; kept apart from the running choices, as a choice
        # that left mid-lease still reads its prompt until the next decision removes it.
        self._read: dict[int, int] = {}

    def lease(self, joining: int, prefilling: int, free_slot_in: int | None) -> int:
        """Batch steps before the next decision. `free_slot_in`: steps until a running sequence
        reaches max_tokens, when requests wait for its slot (None: none wait)."""
        if joining or prefilling or self.step_s <= 0:
            return 1  # a prefill step is already long (about PREFILL_TARGET_S): decide each time
        steps = int(LEASE_S / self.step_s)
        if free_slot_in is not None:
            steps = min(steps, free_slot_in)
        return max(1, min(steps, MAX_LEASE_STEPS))

    def chunk(self, joining: int, prefilling: int) -> int:
        """Prompt tokens per sequence in the next step: a prefill step of all the prompts being
        read takes about PREFILL_TARGET_S at the measured pace."""
        prompts = max(1, min(prefilling + joining, PREFILL_BATCH))
        budget = self.prefill_rate * PREFILL_TARGET_S
        return max(MIN_CHUNK, min(self.max_chunk, int(budget / prompts)))

    def prompt_read(self, prompt_responses: list[Any], took_s: float) -> None:
        """One step's prompt progress: the prefill pace, from the tokens read in `took_s`."""
        read = 0
        for r in prompt_responses:
            read += r.progress[0] - self._read.get(r.uid, 0)
            self._read[r.uid] = r.progress[0]
            if r.end_of_prompt:
                self._read.pop(r.uid, None)
        if read:
            self.prefill_rate = _ema(self.prefill_rate, read / max(took_s, 1e-4), 0.5)

    def decode_step(self, wall_s: float) -> None:
        """A whole decode step's wall time (the batch, rank 0's own work, any pause): what a
        lease is measured in."""
        self.step_s = _ema(self.step_s, wall_s, 0.2)

    def forget(self, uid: int) -> None:
        self._read.pop(uid, None)


def _ema(old: float, new: float, weight: float) -> float:
    """A moving average that starts at the first measurement (old == 0: none yet)."""
    return new if old <= 0 else (1 - weight) * old + weight * new
