"""The live local rank processes started with a marker in their environment (ranks inherit their
launcher's environment): how tests and the soak script find the ranks of the serve they started,
to kill one or read its memory, without asking the server under test."""

from __future__ import annotations

from pathlib import Path


def marked_rank_pids(var: str, marker: str) -> dict[int, int]:
    """{MLX_RANK: pid} of the live `cluster.rank` processes whose environment has var=marker
    (Linux: /proc; empty where there is none)."""
    found: dict[int, int] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"cluster.rank" not in (entry / "cmdline").read_bytes().split(b"\0"):
                continue
            env = dict(
                item.decode(errors="replace").partition("=")[::2]
                for item in (entry / "environ").read_bytes().split(b"\0")
                if item
            )
        except OSError:  # gone meanwhile, or another user's
            continue
        if env.get(var) == marker:
            found[int(env.get("MLX_RANK", "-1"))] = int(entry.name)
    return found
