"""This machine's measured rates for `--local N`: `python -m cluster.microbench` run once, then read
back in this process from the rates cache (cluster/bench/rates_cache.py, the file the
microbenchmark itself keeps); for a float32 model, once more on its own matrices (float32's
decode rates depend on the shape on OpenBLAS). A failed measurement leaves the rates unknown
(the chip table stands in) and is not kept, so the next plan tries again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

import click

from cluster.bench import rates_cache
from cluster.microbench import KEY_ENV, MAX_DIM
from topology.errors import one_line
from topology.host_rates import HostRates, parse_rates
from topology.model.spec import ModelSpec

SHAPED_MAX_BYTES = 1 << 30
MEASURE_TIMEOUT_S = 60.0  # the benchmark takes a few seconds; a Mac's first Metal start more
rates_key, rates_path = rates_cache.rates_key, rates_cache.rates_path  # the cache's, re-exported


def _cached(key: dict[str, str]) -> HostRates | None:
    raw = rates_cache.cached(key)
    try:
        return parse_rates(json.dumps(raw)) if raw is not None else None
    except ValueError:  # kept, but not rates: measured again
        return None


def _warn(line: str) -> None:
    click.echo(f"mlx-cluster: warning: {line}", err=True)


def measure(
    key: dict[str, str], shapes: Sequence[tuple[int, int, int]] = (), kind: str = "float32"
) -> str | None:
    """rates.json's text from this interpreter's microbenchmark, which keeps it under `key`
    (with the model's `shapes` in `kind`, under the key and them); None (said on stderr) when
    it fails."""
    argv = [sys.executable, "-m", "cluster.microbench"]
    if shapes:
        argv += ["--shapes", rates_cache.shapes_text(shapes), "--shape-kind", kind]
    env = {**os.environ, KEY_ENV: json.dumps(key)}
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=MEASURE_TIMEOUT_S, stdin=subprocess.DEVNULL,
            env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = one_line(str(e), 200)
        _warn(f"could not measure this machine's rates ({reason}); using the chip table")
        return None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no error output"]
        _warn(
            f"could not measure this machine's rates (exit {done.returncode}: "
            f"{one_line(err[-1], 200)}); using the chip table"
        )
        return None
    return done.stdout.decode("utf-8", "replace")


def layer_shapes(spec: ModelSpec, ranks: int = 1) -> tuple[tuple[int, int, int], ...]:
    """A float model's matrices (K, N, times a token): one layer's q, k, v, o, gate, up and
    down, once a layer, and the LM head once, whose decode rates `--local` measures in its
    `activation_dtype` (they depend on the shape: OpenBLAS's float32, MLX's own bfloat16); none for
    a quantized model (MLX's kernel: the same rate at every shape measured) nor for latent or
    linear attention. With `ranks` > 1: the largest share a tensor rank of that many multiplies
    by (its heads, KV heads and MLP columns, even shares rounded up; the head whole), which
    OpenBLAS runs at rates of its own (one thread here: a 1024x2048 layer 2.7 GFLOP/s, its
    third 6.9)."""
    if spec.bits < 16 or spec.is_mla or spec.is_hybrid:
        return ()
    dense = len(spec.sparse_layers) < spec.layers
    width = spec.intermediate if dense else spec.moe_intermediate or spec.intermediate
    heads, kv_heads = -(-spec.heads // ranks), -(-spec.kv_heads // ranks)
    h, q, kv = spec.hidden, heads * spec.head_dim, kv_heads * spec.head_dim
    width = -(-width // ranks)
    layer = ((h, q), (h, kv), (h, kv), (q, h), (h, width), (h, width), (width, h))
    shapes = (*((k, n, spec.layers) for k, n in layer), (h, spec.vocab, 1))
    ok = all(0 < x <= MAX_DIM for shape in shapes for x in shape)
    # the microbenchmark holds at least one of each: a model too large for that keeps the
    # machine's rates (a CPU decodes such a model too slowly for the shape to matter)
    ok = ok and sum(k * n for k, n, _ in shapes) * spec.dtype_bytes <= SHAPED_MAX_BYTES
    return shapes if ok else ()


def tensor_share_rates(spec: ModelSpec, ranks: int) -> HostRates | None:
    """This machine's rates with the model's decode points timed on a tensor share's matrices
    over `ranks` ranks; None where there is nothing of the kind to time (one rank, a quantized
    model)."""
    shapes = layer_shapes(spec, ranks) if ranks > 1 else ()
    return local_rates(shapes, spec.activation_dtype) if shapes else None


def local_rates(
    shapes: Sequence[tuple[int, int, int]] = (), kind: str = "float32"
) -> HostRates | None:
    """This machine's rates (`kind`'s decode points timed on a model's `shapes` when given, on
    a CPU): cached when measured before with the same key, else measured now (a few seconds)
    and cached; None when the measurement failed."""
    key = rates_key()
    cached = _cached(rates_cache.shaped_key(key, shapes, kind))
    if cached is not None:
        return cached
    if shapes:
        # A GPU streams a decoding weight at its bandwidth whatever the shape (there the
        # memory term binds): shapes are timed only for a CPU's kernels.
        machine = local_rates()
        if machine is None or machine.device != "cpu":
            return machine
    text = measure(key, shapes, kind)  # the microbenchmark keeps what it measured (its BLAS line)
    if text is None:
        return None
    try:
        return parse_rates(text)
    except ValueError as e:
        _warn(f"this machine's microbenchmark printed no rates ({e}); using the chip table")
        return None
