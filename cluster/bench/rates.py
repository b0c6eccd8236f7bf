"""What this host's MLX computes and copies per second on its default device (cluster.microbench).

Copy bandwidth: a large float32 array (256 MB on a GPU, 128 MB on a CPU) has 1 added to every
element (read once, written once; an add, not a copy, so no lazy view can skip the work).
Matmul throughput: x @ W.T as a model's linear layers call it, at 1, 8 and 512 rows, with a
2048 x 2048 weight of each kind (a float dtype, or 4- / 8-bit affine quantization in groups of
64 with bfloat16 activations and scales, as mlx-community's models are); GFLOP/s =
2 · rows · K · N / seconds.

Every point gets a share of a wall-clock budget, so a slow host (the reference BLAS, MLX's CPU
quantized kernels: 0.1 GFLOP/s here) still finishes in seconds: a point whose call would not fit
its share, judged from the kind's rate at fewer rows, is timed with fewer output columns (N).
A matmul rate kept is the best sample, not the median: other processes only ever add time, and
the planner wants what a rank here can attain. A layer's small ops are the median step's (see
medians): they are paid every token, and their best sample is noise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn

from cluster import blas
from topology.host_rates import ROWS, HostRates, activation_dtype

WIDTH = 2048  # K, and N unless cut to fit the budget: one mid-sized model's layer
GROUP = 64  # mlx-lm's default quantization group
MIN_OUT = 8  # the narrowest N a point is cut to (MLX's CPU quantized kernels: 0.1 GFLOP/s)
# Beyond any cache, as a model's weights are; a CPU's copy is slower and its caches smaller.
GPU_COPY_BYTES, CPU_COPY_BYTES = 256 << 20, 128 << 20
COPY_SHARE = 0.15  # of the budget
MAX_CALLS = 64  # calls evaluated together in one sample (short GPU calls: launch cost shared)
MAX_SAMPLES = 10
SAMPLE_SHARE = 0.1  # of a point's budget: how long one sample of several calls aims to last
SAFETY = 4  # a call is sized to 1/4 of its point's budget: the guess from fewer rows can be 2x off

ONE_THREAD_SHARE = 0.3  # of the budget, added: the BLAS kinds again on one thread
LAYER_SHARE = 0.6  # of the budget, added: a layer's work besides its matmuls (layer_overhead)
# What MLX's CPU backend hands to BLAS (cblas_sgemm); the other kinds it computes itself.
BLAS_KINDS = ("float32",)
FLOATS = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
QUANTIZED_DTYPE = mx.bfloat16  # activations and scales of a quantized model

Mul = Callable[[mx.array], mx.array]  # x -> x @ W.T for one weight


def _seconds(run: Callable[[int], None], calls: int) -> float:
    start = time.perf_counter()
    run(calls)
    return time.perf_counter() - start


def best_per_call(run: Callable[[int], None], budget_s: float) -> float:
    """Seconds per call of `run(n)` (n calls, evaluated together), best sample. The first call
    is also the warm-up (kernels built, buffers allocated, BLAS threads started): alone it
    counts only when it took twice the budget (a slow path, beside which such costs are
    small). A second call sizes the samples of several calls, taken while the budget lasts."""
    first, samples = _per_call_samples(run, budget_s)
    return min([first, *samples])


def median_per_call(run: Callable[[int], None], budget_s: float) -> float:
    """Seconds per call of `run(n)` as best_per_call samples it, the median sample (the warm-up
    call left out unless it is all there is)."""
    first, samples = _per_call_samples(run, budget_s)
    return statistics.median(samples) if samples else first


def _per_call_samples(run: Callable[[int], None], budget_s: float) -> tuple[float, list[float]]:
    """(the warm-up call's seconds, seconds per call of each sample after it)."""
    start = time.perf_counter()
    first = max(_seconds(run, 1), 1e-9)
    if first >= 2 * budget_s:
        return first, []
    samples = [max(_seconds(run, 1), 1e-9)]
    best = min(first, samples[0])
    calls = max(1, min(MAX_CALLS, int(budget_s * SAMPLE_SHARE / best)))
    for _ in range(MAX_SAMPLES):
        if time.perf_counter() - start + calls * best > budget_s:
            break
        samples.append(max(_seconds(run, calls) / calls, 1e-9))
        best = min(best, samples[-1])
    return first, samples


def pattern(shape: tuple[int, int], scale: float) -> mx.array:
    """Values spread over ±scale/2, made by a few elementwise passes: random draws of millions
    of values cost a CPU a good part of the budget, and the values do not change the speed."""
    n = shape[0] * shape[1]
    return ((mx.arange(n, dtype=mx.float32) % 251) / 251 - 0.5).reshape(shape) * scale


def copy_gbs(budget_s: float) -> float:
    """Bytes read + written per second (/1e9) by an elementwise pass over a large array."""
    size = GPU_COPY_BYTES if device() == "gpu" else CPU_COPY_BYTES
    a = mx.arange(size // 4, dtype=mx.float32)  # materialized, unlike zeros (a broadcast)
    mx.eval(a)

    def run(calls: int) -> None:
        y = a
        for _ in range(calls):
            y = y + 1  # after the first, MLX may write in place: still one read and one write
        mx.eval(y)

    return 2 * size / best_per_call(run, budget_s) / 1e9


def _weight(kind: str, w: mx.array) -> tuple[mx.Dtype, Callable[[int], Mul]]:
    """The activation dtype, and for N the multiply by the first N rows of w in this kind."""
    if kind in FLOATS:
        wf = w.astype(FLOATS[kind])
        mx.eval(wf)

        def floats(n: int) -> Mul:
            rows = wf[:n]
            return lambda x: x @ rows.T

        return FLOATS[kind], floats
    name, _, activations = kind.partition("-")
    bits = int(name.removeprefix("q"))
    dtype = FLOATS[activations] if activations else QUANTIZED_DTYPE
    q, scales, biases = mx.quantize(w.astype(dtype), group_size=GROUP, bits=bits)
    mx.eval(q, scales, biases)

    def quantized(n: int) -> Mul:
        parts = (q[:n], scales[:n], biases[:n])
        return lambda x: mx.quantized_matmul(x, *parts, transpose=True, group_size=GROUP, bits=bits)

    return dtype, quantized


def _out_width(rows: int, rate_gflops: float | None, budget_s: float) -> int:
    """N for this point: WIDTH unless one call, at the rate seen at fewer rows, overruns its
    share (more rows usually only share the weight's reads; SAFETY covers a slower rate)."""
    if rate_gflops is None:
        return WIDTH
    call_s = 2 * rows * WIDTH * WIDTH / (rate_gflops * 1e9)
    target_s = budget_s / SAFETY
    if call_s <= target_s:
        return WIDTH
    return max(MIN_OUT, int(WIDTH * target_s / call_s) // MIN_OUT * MIN_OUT)


def _runner(mul: Mul, x: mx.array) -> Callable[[int], None]:
    # The same x every call: MLX evaluates every node it is given, merging none (checked: n
    # calls take n times as long).
    return lambda calls: mx.eval([mul(x) for _ in range(calls)])


def matmul_gflops(kind: str, w: mx.array, budget_s: float) -> dict[int, float]:
    """GFLOP/s of x @ W.T at each of ROWS for this weight kind, each point timed within an
    equal share of budget_s (making the weight and inputs not counted)."""
    dtype, weight = _weight(kind, w)
    rates: dict[int, float] = {}
    rate: float | None = None
    for rows in ROWS:
        point_s = budget_s / len(ROWS)
        out = _out_width(rows, rate, point_s)
        x = pattern((rows, WIDTH), 2.0).astype(dtype)
        mx.eval(x)
        seconds = best_per_call(_runner(weight(out), x), point_s)
        rate = rates[rows] = 2 * rows * WIDTH * out / seconds / 1e9
    return rates


# A decoder layer's work besides its large matmuls, timed on a narrow llama-style layer (whose
# matmuls cost nothing): the per-layer cost of a step's many small ops (norms, rope, the cache
# update, attention, SwiGLU, residuals; on a CPU each is a kernel of its own), and the seconds
# per element of an exp-type pass (SiLU over the MLP, softmax over the scores), which on a CPU
# is scalar and single-threaded: at a prefill chunk's rows it outlasts float32's matmuls.
SHELL_WIDTH, SHELL_HEADS, SHELL_CONTEXT = 64, 2, 256
SHELL_LAYERS = (4, 12)  # steps timed; the difference is per layer (the eval's own cost cancels)
EXP_SHAPE = (256, 2048)  # activations of a mid-sized model's prefill, beyond a call's overhead


def _shell_step(x: mx.array, p: dict[str, mx.array], cache: tuple[mx.array, mx.array]) -> mx.array:
    """One llama-style decoder layer at the shell's width, attending to `cache` (keys, values)."""
    b, rows, width = x.shape
    dim = width // SHELL_HEADS
    h = mx.fast.rms_norm(x, p["norm"], 1e-5)

    def heads(w: mx.array, n: int) -> mx.array:
        return (h @ w.T).reshape(b, rows, n, dim).transpose(0, 2, 1, 3)

    offset = cache[0].shape[2]
    q = mx.fast.rope(heads(p["q"], SHELL_HEADS), dim, traditional=False, base=1e4, scale=1.0,
                     offset=offset)  # fmt: skip
    k = mx.fast.rope(heads(p["k"], 1), dim, traditional=False, base=1e4, scale=1.0, offset=offset)
    keys = mx.concatenate([cache[0], k], axis=2)
    values = mx.concatenate([cache[1], heads(p["v"], 1)], axis=2)
    mask = "causal" if rows > 1 else None
    o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=dim**-0.5, mask=mask)
    x = x + o.transpose(0, 2, 1, 3).reshape(b, rows, width) @ p["o"].T
    h = mx.fast.rms_norm(x, p["norm"], 1e-5)
    return x + (nn.silu(h @ p["gate"].T) * (h @ p["up"].T)) @ p["down"].T


def medians(runs: Sequence[Callable[[], None]], budget_s: float) -> list[float]:
    """Median seconds of each run, called in turn, one call a sample, while the budget lasts
    (each called once first, untimed). A step's small ops are what it pays every token, noise
    and all, and bench reports the median trial: here the best sample of 4 layers taken from
    the best of 12 moved 210-720 us a layer between runs, the medians' 160-320."""
    for run in runs:
        run()
    samples: list[list[float]] = [[] for _ in runs]
    start = time.perf_counter()
    while time.perf_counter() - start < budget_s or not samples[0]:
        for run, kept in zip(runs, samples, strict=True):
            began = time.perf_counter()
            run()
            kept.append(time.perf_counter() - began)
    return [statistics.median(kept) for kept in samples]


def layer_overhead(dtype: mx.Dtype, budget_s: float) -> tuple[float, float]:
    """(seconds a layer of a one-row step spends besides its matmuls, seconds per element of
    an exp-type pass) for activations of `dtype`."""
    w, d = SHELL_WIDTH, SHELL_WIDTH // SHELL_HEADS
    shapes = {"q": (w, w), "k": (d, w), "v": (d, w), "o": (w, w), "gate": (2 * w, w),
              "up": (2 * w, w), "down": (w, 2 * w)}  # fmt: skip
    p = {name: pattern(shape, shape[1] ** -0.5).astype(dtype) for name, shape in shapes.items()}
    p["norm"] = mx.ones((w,), dtype=dtype)
    cache = (pattern((SHELL_CONTEXT, d), 1.0).astype(dtype).reshape(1, 1, SHELL_CONTEXT, d),) * 2
    x = pattern((1, w), 1.0).astype(dtype).reshape(1, 1, w)
    mx.eval(p, cache, x)

    def step(layers: int) -> Callable[[], None]:
        def run() -> None:
            h = x
            for _ in range(layers):
                h = _shell_step(h, p, cache)
            mx.eval(h)

        return run

    a = pattern(EXP_SHAPE, 2.0).astype(dtype)
    g = a + 1
    mx.eval(a, g)
    few, many = SHELL_LAYERS
    short, long, exp_s = medians([step(few), step(many), lambda: mx.eval(nn.silu(a) * g)], budget_s)
    per_layer = (long - short) / (many - few)
    # 12 layers never take less than 4; noise can make it look so. The floor keeps
    # the figure a positive number, as rates.json's reader requires.
    return max(per_layer, 1e-9), exp_s / a.size


# The 1- and 8-row float32 rates depend on the matrix's shape on OpenBLAS (measured here, one
# thread: 576x1536 4.3 GFLOP/s, 1536x576 8.3, 2048x2048 2.7, SmolLM2's 576x49152 LM head 3.2),
# and MLX's own bfloat16 kernel's too (512x512 2.2, 2048x2048 2.6), so `--local` times a float
# model's kind again on the model's own matrices (microbench --shapes): each set of
# matrices that occur equally often (a layer's, x layers; the head, once) copied until the
# copies outgrow any cache, as a decoding model's weights do, and multiplied in turn.
# A round's figure is its samples' median, not the best: a token pays every matmul, noise and
# all (SmolLM2's own weights multiplied in turn, two threads: 6.3 GFLOP/s, the median of 10;
# the best sample of its shapes said 7.1, and its decode was over-predicted by 18 %).
SHAPED_BYTES = 128 << 20
SHAPED_ROWS = (1, 8)
ROUNDS = 2  # a set's budget split into rounds taken in turn with the others', the best kept

Shape = tuple[int, int, int]  # K, N, and how many times the model multiplies by one a token


def _set_seconds(
    matrices: Sequence[tuple[int, int]], budget_s: float, dtype: mx.Dtype
) -> dict[int, float]:
    """Seconds to multiply by each of these (K, N) weights once, at each of SHAPED_ROWS."""
    one_set = sum(dtype.size * k * n for k, n in matrices)
    copies = max(1, -(-SHAPED_BYTES // one_set))
    weights = [
        (pattern((n, k), k**-0.5) * (1 + i / copies)).astype(dtype)
        for i in range(copies)
        for k, n in matrices
    ]
    mx.eval(weights)
    seconds = dict.fromkeys(SHAPED_ROWS, float("inf"))
    xs = {rows: {k: pattern((rows, k), 2.0).astype(dtype) for k, _ in matrices} for rows in seconds}
    mx.eval([list(x.values()) for x in xs.values()])
    for _ in range(ROUNDS):  # in turn: a burst of other work spoils one round, not the figure
        for rows in SHAPED_ROWS:

            def run(calls: int, x: dict[int, mx.array] = xs[rows]) -> None:
                mx.eval([x[w.shape[1]] @ w.T for _ in range(calls) for w in weights])

            share = budget_s / len(SHAPED_ROWS) / ROUNDS
            seconds[rows] = min(seconds[rows], median_per_call(run, share) / copies)
    return seconds


def shaped_gflops(
    shapes: Sequence[Shape], budget_s: float, dtype: mx.Dtype = mx.float32
) -> dict[int, float]:
    """GFLOP/s of x @ W.T in `dtype` over a model's weights of these shapes, each as often as
    the model multiplies by it, at each of SHAPED_ROWS."""
    sets: dict[int, list[tuple[int, int]]] = {}
    for k, n, count in shapes:
        sets.setdefault(count, []).append((k, n))
    flops = dict.fromkeys(SHAPED_ROWS, 0.0)
    seconds = dict.fromkeys(SHAPED_ROWS, 0.0)
    for count, matrices in sets.items():
        timed = _set_seconds(matrices, budget_s / len(sets), dtype)
        for rows in SHAPED_ROWS:
            flops[rows] += count * sum(2 * rows * k * n for k, n in matrices)
            seconds[rows] += count * timed[rows]
    return {rows: _round(flops[rows] / seconds[rows] / 1e9) for rows in SHAPED_ROWS}


def shaped(
    rates: HostRates, shapes: Sequence[Shape], seconds: float, kind: str = "float32"
) -> HostRates:
    """`rates` with the float kind's 1- and 8-row points (float32's on one thread too) timed on
    these shapes."""
    dtype = FLOATS[kind]
    table = {k: dict(v) for k, v in rates.matmul_gflops.items()}
    table[kind] = {**table.get(kind, {}), **shaped_gflops(shapes, seconds, dtype)}
    one = {k: dict(v) for k, v in rates.one_thread_gflops.items()}
    with one_blas_thread() as several:
        if several and kind in one:  # a BLAS kind (float32): what ranks sharing cores get
            one[kind] |= shaped_gflops(shapes, seconds * ONE_THREAD_SHARE, dtype)
    return dataclasses.replace(rates, matmul_gflops=table, one_thread_gflops=one)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[bool]:
    """A CPU's OpenBLAS on one thread for the block, then back; yields False (nothing changed)
    where there is no OpenBLAS or it runs one thread anyway: no one-thread figures to take."""
    threads = blas.blas_threads() if device() == "cpu" else None
    several = threads is not None and threads > 1 and blas.set_blas_threads(1)
    try:
        yield several
    finally:
        if several and threads is not None:
            blas.set_blas_threads(threads)


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def device() -> str:
    return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"


def measure(kinds: Sequence[str], seconds: float) -> HostRates:
    """The host's rates: `seconds` of timing shared out (a COPY_SHARE to the copy, the rest
    equally to the kinds), plus making the arrays (kept small: one weight cast per kind).

    A CPU whose OpenBLAS runs several threads times its BLAS kinds (float32) once more on one
    thread, in a further ONE_THREAD_SHARE of `seconds`: N ranks on the host split its cores,
    and at a decode's few rows one thread does nearly what all of them do."""
    copy = copy_gbs(seconds * COPY_SHARE)
    # Scaled as an initialized layer is, so float16 sums stay finite.
    w = pattern((WIDTH, WIDTH), WIDTH**-0.5)
    mx.eval(w)
    per_kind = seconds * (1 - COPY_SHARE) / len(kinds)
    table = {
        kind: {r: _round(g) for r, g in matmul_gflops(kind, w, per_kind).items()} for kind in kinds
    }
    one: dict[str, dict[int, float]] = {}
    blas_kinds = [k for k in kinds if k in BLAS_KINDS]
    share = seconds * ONE_THREAD_SHARE / max(1, len(blas_kinds))
    with one_blas_thread() as several:
        for kind in blas_kinds if several else ():
            one[kind] = {r: _round(g) for r, g in matmul_gflops(kind, w, share).items()}
    threads = blas.blas_threads() if device() == "cpu" else None
    # The activations' dtypes of the kinds timed (quantized: bfloat16, or float32 for -float32)
    dtypes = {activation_dtype(k) for k in kinds}
    layer_us, exp_ns = {}, {}
    for name in sorted(dtypes):
        layer_s, exp_s = layer_overhead(FLOATS[name], seconds * LAYER_SHARE / len(dtypes))
        layer_us[name], exp_ns[name] = _round(layer_s * 1e6), _round(exp_s * 1e9)
    return HostRates(
        _round(copy), table, device(), threads=threads or 1, one_thread_gflops=one,
        layer_us=layer_us, exp_ns=exp_ns,
    )  # fmt: skip
