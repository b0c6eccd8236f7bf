"""The mixed load: N client loops (a kind drawn by weight, a short pause, again) and the hostile
trickle, until the soak's end. Every request is bounded by a timeout: one that runs past it is
a hang, cancelled and counted as one."""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from . import hostile
from .kinds import KINDS, Ctx


@dataclass
class Record:
    kind: str
    client: int
    start: float  # seconds on the soak's clock
    end: float
    ok: bool
    error: str = ""  # "Type: message" or "hang"
    gaps: list[tuple[float, float]] = field(default_factory=list)
    text: str = ""
    status: int | None = None  # hostile bodies: the HTTP status

    @property
    def hostile(self) -> bool:
        return self.kind == "hostile"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["gaps"] = len(self.gaps)
        return out


async def run_one(ctx: Ctx, kind: str, client: int, rng: random.Random, timeout_s: float) -> Record:
    fn = KINDS[kind][0]
    start = ctx.now()
    try:
        async with asyncio.timeout(timeout_s):
            outcome = await fn(ctx, rng)
    except TimeoutError:
        return Record(kind, client, start, ctx.now(), False, "hang")
    except Exception as e:  # the clients' errors: what we count, not what stops the soak
        return Record(kind, client, start, ctx.now(), False, f"{type(e).__name__}: {e}"[:300])
    return Record(kind, client, start, ctx.now(), True, gaps=outcome.gaps, text=outcome.text)


async def client_loop(
    ctx: Ctx, client: int, seed: int, timeout_s: float, out: list[Record]
) -> None:
    rng = random.Random(seed * 1000 + client)
    names = list(KINDS)
    weights = [KINDS[k][1] for k in names]
    while ctx.now() < ctx.stop_at:
        kind = rng.choices(names, weights)[0]
        out.append(record := await run_one(ctx, kind, client, rng, timeout_s))
        # Not lockstep: arrivals spread over time; after an error a pause, as a client would
        # back off (else a failover's down time is thousands of instant 503s).
        await asyncio.sleep(rng.uniform(0.0, 0.5) + (0.0 if record.ok else 1.0))


async def hostile_loop(
    ctx: Ctx, root: str, every_s: float, timeout_s: float, out: list[Record]
) -> None:
    i = 0
    while ctx.now() + every_s < ctx.stop_at:
        await asyncio.sleep(every_s)
        path, body = hostile.BODIES[i % len(hostile.BODIES)]
        start = ctx.now()
        status = await asyncio.to_thread(hostile.post, root, path, body, timeout_s)
        ok = 400 <= status < 500
        error = "" if ok else f"{path} #{i % len(hostile.BODIES)}: HTTP {status}"
        out.append(Record("hostile", -1, start, ctx.now(), ok, error, status=status))
        i += 1
