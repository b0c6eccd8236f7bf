"""The workloads of bench_serve.py, one module each (see base.Workload). New kinds of rounds
(other request kwargs, servers or levels): a RoundKind in ROUND_KINDS; new kinds of work: a
Workload in WORKLOADS. The order is the order they run in and their rows' order."""

from __future__ import annotations

from typing import Any

from .base import Target, Workload
from .json_schema import ANSWER_SCHEMA, JSON_SCHEMA
from .multi_turn import MULTI_TURN
from .rounds import PLAIN, RoundKind

ROUND_KINDS: tuple[RoundKind, ...] = (PLAIN, JSON_SCHEMA)
WORKLOADS: tuple[Workload[Any], ...] = (*ROUND_KINDS, MULTI_TURN)

__all__ = ["ANSWER_SCHEMA", "ROUND_KINDS", "WORKLOADS", "RoundKind", "Target", "Workload"]
