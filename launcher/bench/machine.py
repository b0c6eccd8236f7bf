"""The machine a benchmark ran on, for its JSON and its report: chip, cores, memory, OS, MLX."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topology.facts import HostFacts


def _cpu_name() -> str:
    """The chip on a Mac (its brand string), the CPU model on Linux, else the architecture."""
    from launcher.planning.cluster_plan import this_machine

    chip = this_machine().chip
    if chip:
        return chip
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(hosts: Sequence[HostFacts] = ()) -> dict[str, Any]:
    """This machine (where rank 0 runs for --local N); the probed hosts of a cluster too."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "chip": _cpu_name(),
        "cores": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
        "os": platform.platform(),
        "python": platform.python_version(),
        "mlx_version": _version("mlx"),
        "mlx_lm_version": _version("mlx-lm"),
    }
    if hosts:
        info["hosts"] = [
            {"name": h.name, "chip": h.chip, "memory_bytes": h.memory_bytes, "macos": h.macos}
            for h in hosts
        ]
    return info


def machine_line(info: dict[str, Any]) -> str:
    memory = info.get("memory_bytes") or 0
    return (
        f"machine: {info.get('chip')}, {info.get('cores')} cores, {memory / 2**30:.0f} GiB, "
        f"{info.get('os')}, mlx {info.get('mlx_version')}"
    )
