"""A problem before its severity is known: severity depends on the backend the user targets."""

from __future__ import annotations

from dataclasses import dataclass

from topology.facts import Backend

BACKEND_ORDER: tuple[Backend, ...] = ("jaccl", "jaccl-ring", "ring")  # best first
RDMA_BACKENDS: frozenset[Backend] = frozenset({"jaccl", "jaccl-ring"})
ALL_BACKENDS: frozenset[Backend] = frozenset(BACKEND_ORDER)
NO_BACKEND: frozenset[Backend] = frozenset()
RING: frozenset[Backend] = frozenset({"ring"})


@dataclass(frozen=True)
class Finding:
    code: str
    hosts: tuple[str, ...]
    message: str
    fix: str
    blocks: frozenset[Backend]  # the backends this keeps from working; an error when targeted
