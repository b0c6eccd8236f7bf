"""Hardware numbers the planner needs: memory bandwidth per chip, usable GPU memory, link costs.

Sources: Apple's published unified-memory bandwidth per chip and the jaccl all_sum timings over
TB5 (2× M4 Pro), as collected in the project's reference notes; the decode efficiency and the
per-step overhead of a distributed step are fitted to exo 1.0's published 1/2/4-node figures by
scripts/calibrate_prediction.py (run it to see the fit and its error).
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.facts import HostFacts

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
