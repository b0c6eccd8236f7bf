"""`python -m cluster.microbench [--kinds float32,q4,...] [--seconds S] [--shapes KxN*C,...]`:
this host's rates.

Prints one JSON object, rates.json of a snapshot (topology/host_rates.py parses it): copy
bandwidth and matmul GFLOP/s per weight kind at 1, 8 and 512 rows on MLX's default device
(cluster/bench/rates.py measures), a layer's work besides its matmuls, plus the BLAS MLX
multiplied with. --shapes: float32's 1- and 8-row points timed again on a model's own matrices
(`--local` plans a float32 model with them; kept apart). The topology probe runs it
on every host, the agent once at start, `--local N` once per machine. With the default kinds and
seconds the result is kept (cluster/bench/rates_cache.py) and printed again on the next run
without measuring: a `launch` probes every host, and measuring costs seconds; --fresh measures.

On Linux the rates must be those of the BLAS a rank multiplies with, so before MLX is imported
this executes itself again exactly as a rank does (cluster/blas.py: the same library chosen and
preloaded, the same environment; OpenBLAS's threads those of a rank alone on the host, unless
OPENBLAS_NUM_THREADS says otherwise).
"""

from __future__ import annotations

import json
import os
import sys

import click

from cluster import blas, heap
from cluster.bench import rates_cache
from cluster.job import RankJob
from topology.errors import InputError
from topology.host_rates import DEFAULT_KINDS, FLOATS, KINDS, parse_rates

KEY_ENV = "MLX_CLUSTER_RATES_KEY"  # the cache key, carried over the BLAS re-execution
DEFAULT_SECONDS = 1.5
MAX_SECONDS = 60.0
# The rates are a host's, as one rank alone on it would see them (its BLAS threads: every core).
LONE_RANK = RankJob(rank=0, world_size=1, backend="ring", strategy="tensor", model="")


def with_rank_blas() -> None:
    """Execute this process again with the BLAS a rank here would preload; returns when a rank
    would keep what this process has (not Linux, none installed, already preloaded)."""
    library = blas.choose(os.environ, {})
    if library is None or not sys.executable:
        return
    env = blas.preload_env(os.environ, {}, library, blas.threads_for(LONE_RANK))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def parse_kinds(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in value.split(","))
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise click.BadParameter(f"{bad[0][:20]!r} is not one of {', '.join(KINDS)}")
    if len(set(kinds)) != len(kinds):
        raise click.BadParameter("a kind is named twice")
    return kinds


MAX_SHAPES = 16
MAX_DIM = 1 << 20  # a width, a vocabulary, a count of layers
MAX_ELEMENTS = 1 << 28  # one weight: 1 GiB of float32


def parse_shapes(
    ctx: click.Context, param: click.Parameter, value: str
) -> tuple[tuple[int, int, int], ...]:
    """KxN[*C],...: a model's weight shapes, each multiplied by C times a token (1 if not said)."""
    if not value:
        return ()
    shapes = []
    for part in value.split(","):
        shape, _, count = part.strip().partition("*")
        k, _, n = shape.partition("x")
        numbers = [k, n, count or "1"]
        if not all(x.isdigit() and 0 < int(x) <= MAX_DIM for x in numbers):
            raise click.BadParameter(f"{part[:20]!r} is not KxN or KxN*C (1-{MAX_DIM} each)")
        if int(k) * int(n) > MAX_ELEMENTS:
            raise click.BadParameter(f"{shape[:20]!r} is over {MAX_ELEMENTS} elements")
        shapes.append((int(k), int(n), int(count or "1")))
    if len(shapes) > MAX_SHAPES:
        raise click.BadParameter(f"at most {MAX_SHAPES} shapes")
    return tuple(shapes)


def parse_seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise click.BadParameter(f"{value[:20]!r} is not a number") from None
    if not 0.1 <= seconds <= MAX_SECONDS:  # also refuses nan
        raise click.BadParameter(f"must be 0.1–{MAX_SECONDS:g} seconds")
    return seconds


def _given_key(text: str) -> dict[str, str]:
    """The cache key a caller handed over in MLX_CLUSTER_RATES_KEY: a JSON object of strings."""
    try:
        key = json.loads(text)
    except ValueError:
        key = None
    if not isinstance(key, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in key.items()
    ):
        raise click.ClickException(f"{KEY_ENV} must be a JSON object of strings")
    return key


@click.command()
@click.option(
    "--kinds",
    default=",".join(DEFAULT_KINDS),
    show_default=True,
    callback=parse_kinds,
    help=f"Weight kinds to time, comma-separated ({', '.join(KINDS)}).",
)
@click.option(
    "--seconds",
    default=str(DEFAULT_SECONDS),
    show_default=True,
    callback=parse_seconds,
    help="Seconds of timing, shared by the copy and the kinds (making arrays not counted).",
)
@click.option(
    "--shapes",
    default="",
    callback=parse_shapes,
    help="A model's matrices (KxN or KxN*times a token, ...): the --shape-kind's 1- and 8-row "
    "rates timed on them instead.",
)
@click.option(
    "--shape-kind",
    default="float32",
    show_default=True,
    type=click.Choice(FLOATS),
    help="The float kind --shapes are timed in (the model's weights).",
)
@click.option("--fresh", is_flag=True, help="Measure even when this host's rates are kept.")
def main(
    kinds: tuple[str, ...],
    seconds: float,
    shapes: tuple[tuple[int, int, int], ...],
    shape_kind: str,
    fresh: bool,
) -> None:
    """Measure this host's copy bandwidth and matmul throughput; print them as JSON."""
    # The key comes from the caller's environment, before the BLAS re-execution changes it
    # (--local N reads the same file back in its own process with the same key).
    given = os.environ.get(KEY_ENV)
    key = _given_key(given) if given else rates_cache.rates_key()
    kept = kinds == DEFAULT_KINDS and seconds == DEFAULT_SECONDS
    model_key = rates_cache.shaped_key(key, shapes, shape_kind)
    if kept and not fresh and (hit := rates_cache.cached(model_key)) is not None:
        click.echo(json.dumps(hit))
        return
    os.environ[KEY_ENV] = json.dumps(key)
    try:
        with_rank_blas()
    except InputError as e:  # a bad MLX_CLUSTER_BLAS: a rank here would refuse it too
        raise click.ClickException(str(e)) from None
    heap.return_freed_buffers()  # as a rank does, before MLX allocates
    from cluster.bench.rates import measure, shaped  # MLX only now: after the BLAS is in place

    generic = rates_cache.cached(key) if kept and not fresh else None
    if generic is None:
        generic = {**measure(kinds, seconds).to_json(), "blas": blas.in_use()}
        if kept:
            rates_cache.keep(key, generic)
    out = generic
    if shapes:
        rates = shaped(parse_rates(json.dumps(generic)), shapes, seconds, shape_kind)
        out = {**rates.to_json(), "blas": blas.in_use(), "shapes": model_key["shapes"]}
        if kept:
            rates_cache.keep(model_key, out)
    click.echo(json.dumps(out))


if __name__ == "__main__":
    main()
