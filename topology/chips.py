"""Hardware numbers the planner needs: memory bandwidth per chip, usable GPU memory, link costs.

Sources: Apple's published unified-memory bandwidth per chip and the jaccl all_sum timings over
TB5 (2× M4 Pro), as collected in the project's reference notes; the decode efficiency and the
per-step overhead of a distributed step are fitted to exo 1.0's published 1/2/4-node figures by
scripts/calibrate_prediction.py (run it to see the fit and its error).
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.facts import HostFacts
from topology.host_rates import HostRates

GB = 1_000_000_000
GIB = 1 << 30

# Memory bandwidth in GB/s by chip name (machdep.cpu.brand_string without "Apple ").
# M3 Max and M4 Max come in two bins; see bandwidth_gbs() for how the bin is picked.
_BANDWIDTH_GBS: dict[str, float] = {
    "M1": 68,
    "M1 Pro": 200,
    "M1 Max": 400,
    "M1 Ultra": 800,
    "M2": 100,
    "M2 Pro": 200,
    "M2 Max": 400,
    "M2 Ultra": 800,
    "M3": 100,
    "M3 Pro": 150,
    "M3 Ultra": 819,
    "M4": 120,
    "M4 Pro": 273,
    "M5": 153,  # Apple newsroom, M5 announcement (Oct 2025)
}
# Binned chips: (bandwidth of the cut-down bin, memory sizes it ships with, full bandwidth).
# M3 Max 14-core CPU / 30-core GPU: 300 GB/s, sold with 36 or 96 GB; 16/40-core: 400 GB/s.
# M4 Max 14-core CPU / 32-core GPU: 410 GB/s, sold with 36 GB only; 16/40-core: 546 GB/s.
# HostFacts carries no core count, so the memory size picks the bin.
_BINNED: dict[str, tuple[float, tuple[int, ...], float]] = {
    "M3 Max": (300, (36, 96), 400),
    "M4 Max": (410, (36,), 546),
}

# macOS lets the GPU wire about 75% of memory on Macs with more than 36 GB and about 2/3 on
# smaller ones (Metal's recommendedMaxWorkingSetSize, as widely reported by MLX and llama.cpp
# users) unless `sudo sysctl iogpu.wired_limit_mb=N` raises it. Not measured here: an assumption.
LARGE_MAC_FRACTION = 0.75
SMALL_MAC_FRACTION = 2 / 3
SMALL_MAC_LIMIT_BYTES = 36 * GIB
# Memory macOS itself needs when the wired limit is raised: never suggest wiring more than this.
MACOS_RESERVE_BYTES = 8 * GIB


def chip_key(chip: str | None) -> str | None:
    """'Apple M3 Ultra' -> 'M3 Ultra'; None for anything that is not an Apple M chip."""
    if not chip:
        return None
    name = " ".join(chip.replace("Apple", "").split())
    return name if name.split(" ")[0][:1] == "M" else None


def bandwidth_gbs(chip: str | None, memory_bytes: int | None) -> float | None:
    """Memory bandwidth of a chip, or None when the chip is not in the table."""
    key = chip_key(chip)
    if key is None:
        return None
    if key in _BINNED:
        low, low_sizes, full = _BINNED[key]
        gb = round((memory_bytes or 0) / GIB)
        return low if gb in low_sizes else full
    return _BANDWIDTH_GBS.get(key)


def host_bandwidth_gbs(host: HostFacts) -> float | None:
    """The host's override (cluster file bandwidth_gbs) or its chip's table value."""
    if host.bandwidth_gbs is not None:
        return host.bandwidth_gbs
    return bandwidth_gbs(host.chip, host.memory_bytes)


def usable_memory_bytes(host: HostFacts) -> int | None:
    """GPU-usable memory: the wired limit when set, else the macOS default share."""
    if host.wired_limit_bytes is not None:
        return host.wired_limit_bytes
    if host.memory_bytes is None:
        return None
    small = host.memory_bytes <= SMALL_MAC_LIMIT_BYTES
    return int(host.memory_bytes * (SMALL_MAC_FRACTION if small else LARGE_MAC_FRACTION))


def max_wired_bytes(memory_bytes: int) -> int:
    """The most it is sensible to let the GPU wire, leaving macOS its reserve."""
    return max(0, memory_bytes - MACOS_RESERVE_BYTES)


@dataclass(frozen=True)
class BackendCost:
    """What moving one decode step's hidden state costs on a backend.

    mesh (jaccl): every rank talks to every other directly; an all-reduce costs one round trip.
    ring algorithms (ring, jaccl-ring): reduce-scatter + all-gather = 2(N-1) neighbour hops.
    """

    name: str
    hop_s: float  # one small message to a neighbour (half a small all-reduce's round trip)
    link_bytes_per_s: float
    mesh: bool
    # Measured in decode steps (bench --calibrate, cluster/bench/step_cost.py): a pipeline step
    # costs this beyond its stages' compute, its messages' bytes aside, and hop_s holds all a
    # tensor step's synchronisation (no step overhead besides). None: not measured so.
    pipeline_step_s: float | None = None

    @property
    def in_steps(self) -> bool:
        return self.pipeline_step_s is not None

    def all_reduce_s(self, n: int, size_bytes: int) -> float:
        if n <= 1:
            return 0.0
        if self.mesh:
            return 2 * self.hop_s + size_bytes / self.link_bytes_per_s
        steps = 2 * (n - 1)
        return steps * self.hop_s + steps * size_bytes / n / self.link_bytes_per_s

    def hand_off_s(self, size_bytes: int) -> float:
        """A pipeline stage sending its hidden state to the next stage."""
        return self.hop_s + size_bytes / self.link_bytes_per_s


# jaccl all_sum of 4 KB on 2 ranks over TB5 ≈ 25 µs; ≈ 6.7 GB/s at 4 MB, ≈ 8 GB/s at 64 MB.
JACCL_HOP_S = 12.5e-6
TB5_RDMA_BYTES_PER_S = 7.5e9
# TCP over Thunderbolt: round trips of 0.4–0.9 ms are reported across a TB bridge (exo #2295).
# One ring step ≈ 350 µs (a 2-rank all-reduce ≈ 0.7 ms) reproduces the 28.6 vs 6.6 tok/s
# RDMA/TCP gap reported by oMLX (#3037) for a ~94-layer model; an estimate, not a measurement.
TCP_TB_HOP_S = 350e-6
TCP_TB_BYTES_PER_S = 2.5e9
# Loopback TCP between processes on one machine (--local N): tens of µs per message.
TCP_LOCAL_HOP_S = 30e-6
TCP_LOCAL_BYTES_PER_S = 5e9

BACKENDS: dict[str, BackendCost] = {
    "jaccl": BackendCost("jaccl", JACCL_HOP_S, TB5_RDMA_BYTES_PER_S, mesh=True),
    "jaccl-ring": BackendCost("jaccl-ring", JACCL_HOP_S, TB5_RDMA_BYTES_PER_S, mesh=False),
    "ring": BackendCost("ring", TCP_TB_HOP_S, TCP_TB_BYTES_PER_S, mesh=False),
    "ring-local": BackendCost("ring-local", TCP_LOCAL_HOP_S, TCP_LOCAL_BYTES_PER_S, mesh=False),
}

# Per decoded token, a distributed step costs more than its collectives' wire time: fitted to
# exo 1.0's 2- and 4-node figures (4× M3 Ultra, jaccl; Qwen3 235B 8-bit and DeepSeek V3.1 4-bit).
# The overhead came out the same for a 94-layer and a 61-layer model, so it is modelled per step
# rather than per collective. See scripts/calibrate_prediction.py.
STEP_OVERHEAD_S = 4.2e-3
STEP_OVERHEAD_PER_RANK_S = 2.9e-3


def step_overhead_s(n: int) -> float:
    return 0.0 if n <= 1 else STEP_OVERHEAD_S + STEP_OVERHEAD_PER_RANK_S * (n - 1)


# Share of the memory bandwidth decoding reaches in practice: fitted to exo's single-node
# figures (Qwen3 235B 8-bit 19.5 tok/s, DeepSeek V3.1 4-bit 21.1 tok/s on an M3 Ultra).
DECODE_BANDWIDTH_EFFICIENCY = 0.54


# --- GPU matmul throughput of a Mac never measured (prefill, time to first token) -------------
# Prefill runs 512-row chunks and is compute-bound on a Mac, so a plan without rates.json needs
# a figure for it. Peak = GPU cores x 128 FP32 ALUs a core x 2 FLOPs (a fused multiply-add) x
# the GPU clock. Core counts: Apple's published specifications of each chip (both bins where a
# chip ships in two). Clocks: the commonly reported GPU clocks (e.g. hmc-tech.com's chip pages:
# M1 1278 MHz, M1 Pro/Max/Ultra 1296, M2 and M3 families 1398, M4 family 1578); they agree with
# llama.cpp's pp512 per core and GHz staying within ±6 % from M1 Max to M4 Max
# (https://github.com/ggml-org/llama.cpp/discussions/4167). Apple GPUs run float16 at the FP32
# rate, so the same peak serves every kind.
ALUS_PER_GPU_CORE = 128
FLOPS_PER_ALU_CYCLE = 2


@dataclass(frozen=True)
class GpuChip:
    """One chip's GPU as the compute table knows it."""

    key: str  # "M3 Ultra"
    cores: int  # the bin picked (see _GPU)
    clock_ghz: float

    @property
    def peak_tflops(self) -> float:
        return self.cores * ALUS_PER_GPU_CORE * FLOPS_PER_ALU_CYCLE * self.clock_ghz / 1e3


# chip -> (GPU clock GHz, cores of the cut-down bin, memory sizes (GB) only it ships with,
# cores of the full chip). As with _BINNED, the memory size picks the bin; where both bins ship
# with a size, that size gets the cut-down bin (an optimistic time to first token is worse than
# a pessimistic one, and the plan names the figure it assumed).
_GPU: dict[str, tuple[float, int, tuple[int, ...], int]] = {
    "M1": (1.278, 7, (8,), 8),
    "M1 Pro": (1.296, 14, (16,), 16),
    "M1 Max": (1.296, 24, (32,), 32),
    "M1 Ultra": (1.296, 48, (64,), 64),
    "M2": (1.398, 8, (8,), 10),
    "M2 Pro": (1.398, 16, (16,), 19),
    "M2 Max": (1.398, 30, (32,), 38),
    "M2 Ultra": (1.398, 60, (64,), 76),
    "M3": (1.398, 8, (8,), 10),
    "M3 Pro": (1.398, 14, (18,), 18),
    "M3 Max": (1.398, 30, (36, 96), 40),
    "M3 Ultra": (1.398, 60, (96, 256), 80),  # 512 GB ships only with the 80-core GPU
    "M4": (1.578, 10, (), 10),  # the 8-core GPU bin shares every memory size: 10 assumed
    "M4 Pro": (1.578, 16, (24,), 20),
    "M4 Max": (1.578, 32, (36,), 40),
    # M5 family: Apple's specifications (support.apple.com/en-us/125405, /126318; the Mac Studio
    # announcement of Aug 2026 for the M5 Ultra, "up to 80" GPU cores, cut-down bin not known).
    # Clock not published: 1.75 GHz assumed, from llama.cpp's Metal-only pp512 of the M5 Max
    # (987 tok/s against 886 on the M4 Max at the same 40 cores, discussion #4167).
    "M5": (1.75, 10, (), 10),
    "M5 Pro": (1.75, 16, (24,), 20),
    "M5 Max": (1.75, 32, (36,), 40),
    "M5 Ultra": (1.75, 80, (), 80),
}

# Share of that peak MLX's matmuls reach on a 512-row prefill chunk, per weight kind, counting
# FLOPs as the planner does (2 a weight a row plus attention's scores). An assumption, set from
# published runs (scripts/calibrate_prediction.py shows each one and its error):
# - q4: fitted to mlx-lm's Llama 3.3 70B 4-bit prompt of 689 tokens at 83.6 tok/s on an M3 Max
#   (40 cores, mlx 0.21; https://github.com/ml-explore/mlx-examples/issues/1029): 0.82.
# - q8: as q4 (llama.cpp's Q8_0 and Q4_0 pp512 are within 2 % on every chip of #4167; MLX
#   dequantizes either into 16-bit tiles).
# - bfloat16 / float16: q4 / 0.96, a dense matmul skips the dequantization (llama.cpp's F16 runs
#   3-5 % above its Q4_0 at pp512 on M3 Max, M3 Ultra and M4 Max in #4167).
# - float32 (and quantized weights with float32 activations): half of bfloat16, an assumption
#   with no published MLX figure behind it.
PREFILL_MATMUL_EFFICIENCY: dict[str, float] = {
    "bfloat16": 0.85,
    "float16": 0.85,
    "q4": 0.82,
    "q8": 0.82,
    "float32": 0.42,
    "q4-float32": 0.42,
    "q8-float32": 0.42,
}
# M1 and M2 have no bfloat16 arithmetic of their own: MLX's bfloat16 tiles run slower there.
# M1: 0.56x float16 (MLX's 4-bit matmul, 512 x 6656 x 19968 on an M1 Max: 30.6 ms in bfloat16,
# 17.2 ms in float16; https://github.com/ml-explore/mlx/pull/4216). M2: 0.83x (float16 "~20 %"
# faster prompt processing than bfloat16 on an M2 Max; https://github.com/jundot/omlx/issues/604).
BFLOAT16_SLOWDOWN: dict[str, float] = {"M1": 0.56, "M2": 0.83}
# M5 GPUs have a matrix unit ("Neural Accelerator") in every core, which MLX uses from macOS
# 26.2: llama.cpp's pp512 of the same M5 Max went 987 -> 3,347 tok/s when it used them (3.4x,
# #4167); Apple reports up to 4x the M4's time-to-first-token with MLX
# (machinelearning.apple.com, "Exploring LLMs with MLX and the Neural Accelerators in the M5
# GPU"). 3.4x assumed; an older macOS or MLX gets about a third of it.
M5_MATMUL_GAIN = 3.4


def gpu_chip(chip: str | None, memory_bytes: int | None) -> GpuChip | None:
    """The chip's GPU (the bin its memory size implies), or None when not in the table."""
    key = chip_key(chip)
    if key is None or key not in _GPU:
        return None
    clock, low, low_sizes, full = _GPU[key]
    gb = round((memory_bytes or 0) / GIB)
    return GpuChip(key, low if gb in low_sizes else full, clock)


def gpu_bin(key: str, cores: int) -> GpuChip:
    """A chip's GPU with a given core count (a published figure names its bin)."""
    return GpuChip(key, cores, _GPU[key][0])


def assumed_matmul_gflops(gpu: GpuChip) -> dict[str, float]:
    """GFLOP/s of a 512-row matmul per weight kind on this GPU: peak x the assumed efficiency
    (x M1/M2's bfloat16 slowdown, x the M5's matrix units)."""
    generation = gpu.key.split(" ")[0]
    out = {}
    for kind, efficiency in PREFILL_MATMUL_EFFICIENCY.items():
        bf16 = kind in ("bfloat16", "q4", "q8")  # mlx-community's quantized models: bf16 scales
        slow = BFLOAT16_SLOWDOWN.get(generation, 1.0) if bf16 else 1.0
        # the M5's matrix units take 16-bit operands: float32 stays on the ALUs
        gain = M5_MATMUL_GAIN if generation == "M5" and "float32" not in kind else 1.0
        out[kind] = round(gpu.peak_tflops * 1e3 * efficiency * slow * gain, 1)
    return out


def assumed_rates(host: HostFacts) -> HostRates | None:
    """What a Mac never measured is assumed to compute, from the chip table: only a 512-row point
    a kind, so the rate is flat below it (a decode step stays bound by memory, as before). None
    for a host that is not a Mac or a chip not in the table."""
    gpu = gpu_chip(host.chip, host.memory_bytes) if host.is_mac else None
    if gpu is None:
        return None
    table = {kind: {PREFILL_ROWS: g} for kind, g in assumed_matmul_gflops(gpu).items()}
    copy = host_bandwidth_gbs(host) or 0.0  # unused for a Mac: its bandwidth is the chip's
    return HostRates(copy, table, device="gpu", source="assumed")


PREFILL_ROWS = 512  # the row count the chip table's figures are for (a prefill chunk)
