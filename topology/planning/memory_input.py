"""Memory limits that are wrong as given, refused before anything launches (one line, exit 2).

A wired limit above the machine's memory is a typo, and one too small for even a rank's weights
and margin can never serve: either way the number the user gave (a cluster file's
`wired_limit_gb`, or the wired limit this machine reports) is what must change, so it is bad
input rather than a plan that does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from topology.chips import GIB
from topology.errors import InputError
from topology.facts import HostFacts
from topology.planning.options import Option, gib
from topology.planning.placement import HEADROOM_BYTES, HEADROOM_FRACTION, Slot


def check_wired_limits(hosts: Sequence[HostFacts]) -> None:
    """InputError for the first host (in rank order) whose wired limit exceeds its memory."""
    for rank, h in enumerate(hosts):
        wired, memory = h.wired_limit_bytes, h.memory_bytes
        if wired is not None and memory is not None and wired > memory:
            raise InputError(
                f"rank {rank} on {h.name}: wired_limit_gb {wired / GIB:g} is more than the "
                f"host's {gib(memory)} of memory: give at most {memory // GIB}"
            )


def _short(slots: Sequence[Slot], option: Option) -> str | None:
    """The first rank of this option whose given limit cannot hold its weights and margin."""
    for rank, (slot, load) in enumerate(zip(slots, option.loads, strict=False)):
        usable = slot.usable_bytes
        if not slot.limit_given or usable is None:
            continue
        need = int(load.weight_bytes * (1 + HEADROOM_FRACTION)) + HEADROOM_BYTES
        if usable < need:
            return (
                f"rank {rank} on {slot.host}: its memory budget of {gib(usable)} (the wired "
                f"limit) is less than its {gib(load.weight_bytes)} of weights + "
                f"{gib(need - load.weight_bytes)} margin ({option.strategy} over {len(slots)}): "
                f"raise wired_limit_gb to at least {math.ceil(need / GIB)} for it"
            )
    return None


def check_weights_fit(slots: Sequence[Slot], options: Sequence[Option], strategy: str) -> None:
    """InputError when no plan is valid because a given limit cannot hold the weights: every
    option asked for (all of them for auto) has such a rank."""
    asked = [o for o in options if strategy in ("auto", o.strategy) and o.loads]
    if not asked or any(o.valid for o in asked):
        return
    lines = [_short(slots, o) for o in asked]
    if all(lines):
        raise InputError(str(lines[0]))
