"""More ranks than cores (tensor ×3 on this 2-core machine): MLX's ring backend keeps a thread
per socket retrying a non-blocking recv in a tight loop while a collective waits, so each
waiting rank holds a core and the rank that still computes waits for the scheduler in every one
of a token's 60 all-reduces (0.7 tok/s here, against 9 on one rank). ring_wait.c, preloaded into
both servers of such a group alike, turns that retry into a wait on the socket (4.4 tok/s); it
moves only when a retry happens, never what is sent. Built with the system's C compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("ring_wait.c")


def cores() -> int:
    return os.cpu_count() or 1


def needed(ranks: int) -> bool:
    return ranks > cores()


def build(out_dir: Path) -> Path:
    """The shim's shared library under `out_dir` (rebuilt when the source is newer)."""
    lib = out_dir / "libringwait.so"
    if lib.exists() and lib.stat().st_mtime >= SOURCE.stat().st_mtime:
        return lib
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("bench_speculative: a C compiler is needed for the ring-wait shim")
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(SOURCE), "-ldl"], check=True)
    return lib


def env(ranks: int, out_dir: Path) -> dict[str, str]:
    """LD_PRELOAD for a server of `ranks` local ranks (empty when the cores suffice); the ranks
    inherit it and add their BLAS after it (cluster/blas.py)."""
    if not needed(ranks):
        return {}
    preload = " ".join(p for p in (str(build(out_dir)), os.environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload}
