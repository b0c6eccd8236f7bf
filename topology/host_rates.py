"""What a host computes and copies per second, measured there (`python -m cluster.microbench`).

The planner's step-time model needs two rates per host: memory bandwidth (decode reads every
weight once a token) and matmul throughput at the row count of the step (1 row for one decoding
sequence, a few for a batch or a speculative check, hundreds for a prefill chunk). The chip table
(topology/chips.py) gives the bandwidth of a Mac never measured; only a measurement gives compute,
and on a Linux node it is what binds. Pure: parsed from the JSON the microbenchmark prints
(snapshot file rates.json), InputError-free — a bad file is a probe gap, never a crash.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topology.untrusted import parse_json

# Weight kinds the microbenchmark times: a model's dtype, or its quantization in bits with
# bfloat16 activations and scales (mlx-community's models) or float32 ones (-float32: a model
# quantized from float32 weights; on a CPU these take another, far faster path).
KINDS = ("float32", "float16", "bfloat16", "q4", "q8", "q4-float32", "q8-float32")
DEFAULT_KINDS = ("float32", "bfloat16", "q4", "q8", "q4-float32", "q8-float32")
FLOATS = ("float32", "float16", "bfloat16")
ROWS = (1, 8, 512)  # decode, a batch or speculative check, a prefill chunk


@dataclass(frozen=True)
class HostRates:
    """Measured rates of one host, as one rank alone on it sees them (its BLAS threads: every
    core), and the device they were measured on."""

    copy_gbs: float  # a large array copy: bytes read + written per second / 1e9
    matmul_gflops: Mapping[str, Mapping[int, float]]  # kind -> rows -> GFLOP/s
    device: str = "gpu"  # "gpu" (Metal) or "cpu"
    source: str = "measured"  # or "assumed" (a chip table figure, said so in the plan)
    threads: int = 1  # a CPU's BLAS threads behind matmul_gflops (a lone rank's: every core)
    # The BLAS kinds again on one thread (a CPU with threads > 1): what a rank that shares the
    # cores with others multiplies at. Kinds MLX computes itself run on one thread anyway.
    one_thread_gflops: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    # A layer's work besides its matmuls, per activation dtype (float32, bfloat16): microseconds
    # of a one-row step's small ops, and nanoseconds per element of an exp-type pass (SiLU,
    # softmax). Absent from rates measured before they were (the term is then left out).
    layer_us: Mapping[str, float] = field(default_factory=dict)
    exp_ns: Mapping[str, float] = field(default_factory=dict)

    def gflops(self, kind: str, rows: int) -> float | None:
        """Throughput at `rows` rows for this weight kind: measured points joined linearly in
        log(rows), flat beyond the ends; None when the kind was not measured. An assumed rate
        (the chip table's prefill figure) says nothing of a one-row step: decode stays modelled
        by memory alone, as before the table (DeepSeek's latent attention at a long context
        would otherwise turn compute-bound on the table's figure)."""
        if self.source == "assumed" and rows <= 1:
            return None
        return _between(self.matmul_gflops.get(kind, {}), rows)

    def shared_gflops(
        self, kind: str, rows: int, ranks: int, together: bool = True
    ) -> float | None:
        """What one of `ranks` ranks on this host multiplies at: all of them computing at once
        (tensor), or (together=False) one at a time while the others wait (pipeline stages).

        A GPU is one device: each gets 1/ranks of it at once, all of it alone. A CPU's ranks
        split its cores: each rank's BLAS has threads // ranks of them (cluster/blas.py), its
        rate taken between the one-thread and the all-thread measurement in proportion; more
        ranks than cores computing at once share them in time. A kind with no one-thread figure
        ran on one thread: it keeps its rate while cores last."""
        lone = self.gflops(kind, rows)
        if lone is None or ranks <= 1:
            return lone
        if self.device != "cpu":
            return lone / ranks if together else lone
        time_share = 1.0 / self.crowding(ranks, together)[0]
        one = _between(self.one_thread_gflops.get(kind, {}), rows)
        if one is None or self.threads <= 1:
            return lone * time_share
        each = max(1, self.threads // ranks)
        return (one + (lone - one) * (each - 1) / (self.threads - 1)) * time_share

    def crowding(self, ranks: int, together: bool = True) -> tuple[float, float]:
        """(fair, whole): how many times its time alone a rank's work takes when `ranks` ranks
        compute at once on this CPU's cores, shared evenly (ranks / cores), and in whole
        pieces (ceil(ranks / cores): a piece that runs to its end on one core). (1, 1) while
        the cores last, on a GPU, and for stages that compute one at a time."""
        if self.device != "cpu" or not together or ranks <= self.threads:
            return 1.0, 1.0
        return ranks / self.threads, float(-(-ranks // self.threads))

    def layer_costs(
        self, kind: str, ranks: int = 1, together: bool = True
    ) -> tuple[float, float] | None:
        """(seconds a layer's small ops take in a step, seconds per exp-type element) for one of
        `ranks` ranks on this host multiplying weights of `kind` (or a float dtype); None on a
        GPU or when not measured. On a GPU these kernels run while the large ones stream their
        weights (the bandwidth efficiency fitted to published runs holds them); on a CPU each is
        a single-threaded pass of its own, and more ranks than cores computing at once share
        them in time."""
        dtype = activation_dtype(kind)
        if self.device != "cpu" or dtype not in self.layer_us or dtype not in self.exp_ns:
            return None
        fair = self.crowding(ranks, together)[0]
        # A process builds the next step's graph while a spare core evaluates this one; with no
        # core to spare (its BLAS threads and the other ranks take them all) it does both in
        # turn: a bfloat16 or 4-bit 8-layer model pinned to one core here decodes 3.2 ms a token
        # slower, about its layers' layer_us.
        blas = max(1, self.threads // ranks) if kind in self.one_thread_gflops else 1
        turns = 2.0 if ranks * blas >= self.threads else 1.0
        layer_s = self.layer_us[dtype] * 1e-6 * fair * turns
        return layer_s, self.exp_ns[dtype] * 1e-9 * fair

    def to_json(self) -> dict[str, Any]:
        return {
            "copy_gbs": self.copy_gbs,
            "matmul_gflops": _table_json(self.matmul_gflops),
            "device": self.device,
            "source": self.source,
            "threads": self.threads,
            "one_thread_gflops": _table_json(self.one_thread_gflops),
            "layer_us": dict(self.layer_us),
            "exp_ns": dict(self.exp_ns),
        }


def _between(table: Mapping[int, float], rows: int) -> float | None:
    points = sorted(table.items())
    if not points:
        return None
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, g0), (r1, g1) in itertools.pairwise(points):
        if rows <= r1:
            at = (math.log(rows) - math.log(r0)) / (math.log(r1) - math.log(r0))
            return g0 + at * (g1 - g0)
    return points[-1][1]


def activation_dtype(kind: str) -> str:
    """The activations' dtype of a weight kind: a float kind's own, bfloat16 for q4 / q8,
    float32 for their -float32 forms."""
    if kind in FLOATS:
        return kind
    return "float32" if kind.endswith("-float32") else "bfloat16"


def weight_kind(dtype: str, bits: int) -> str:
    """The microbenchmark's kind for a model's weights: q4 / q8 when quantized (-float32 when
    its activations are float32), else its dtype."""
    if bits < 16:
        base = "q4" if bits <= 4 else "q8"
        return f"{base}-float32" if dtype == "float32" else base
    return dtype if dtype in KINDS else "bfloat16"


def _table_json(table: Mapping[str, Mapping[int, float]]) -> dict[str, dict[str, float]]:
    return {
        kind: {str(r): g for r, g in sorted(by_rows.items())} for kind, by_rows in table.items()
    }


def parse_rates(text: str) -> HostRates:
    """rates.json -> HostRates; ValueError with a short reason on anything malformed."""
    raw = parse_json(text)  # Refused (a ValueError) on bad JSON or deep nesting
    if not isinstance(raw, Mapping):
        raise ValueError("must be a JSON object")
    copy = _rate(raw.get("copy_gbs"), "copy_gbs")
    table = raw.get("matmul_gflops")
    if not isinstance(table, Mapping) or not table:
        raise ValueError("matmul_gflops: must be an object of kinds")
    matmul = _table(table, "matmul_gflops")
    one = raw.get("one_thread_gflops", {})
    if not isinstance(one, Mapping):
        raise ValueError("one_thread_gflops: must be an object of kinds")
    device = raw.get("device", "gpu")
    if device not in ("gpu", "cpu"):
        raise ValueError("device: must be gpu or cpu")
    threads = raw.get("threads", 1)
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 4096:
        raise ValueError("threads: must be a whole number 1-4096")
    return HostRates(
        copy, matmul, device, threads=threads, one_thread_gflops=_table(one, "one_thread_gflops"),
        layer_us=_per_dtype(raw.get("layer_us", {}), "layer_us"),
        exp_ns=_per_dtype(raw.get("exp_ns", {}), "exp_ns"),
    )  # fmt: skip


def _per_dtype(table: Any, name: str) -> dict[str, float]:
    if not isinstance(table, Mapping):
        raise ValueError(f"{name}: must be an object of dtypes")
    out = {}
    for dtype, value in table.items():
        if dtype not in FLOATS:
            raise ValueError(f"{name}: {str(dtype)[:20]!r} is not one of {', '.join(FLOATS)}")
        out[dtype] = _rate(value, f"{name}.{dtype}")
    return out


def _table(table: Mapping[Any, Any], name: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for kind, by_rows in table.items():
        if kind not in KINDS:
            raise ValueError(f"{name}: {str(kind)[:20]!r} is not one of {', '.join(KINDS)}")
        if not isinstance(by_rows, Mapping) or not by_rows:
            raise ValueError(f"{name}.{kind}: must be an object of rows")
        out[kind] = {}
        for rows, g in by_rows.items():
            if not (isinstance(rows, str) and rows.isdigit() and 0 < int(rows) <= 1 << 16):
                raise ValueError(f"{name}.{kind}: {str(rows)[:20]!r} is not a row count")
            out[kind][int(rows)] = _rate(g, f"{name}.{kind}.{rows}")
    return out


def _rate(value: Any, key: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 < value < 1e7 or math.isnan(value):
        raise ValueError(f"{key}: must be a positive number")
    return float(value)
