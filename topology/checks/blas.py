"""The BLAS a Linux host's ranks would multiply with (blas.txt), and the warning when it is the
reference one bundled with mlx[cpu].

blas.txt is one line from the host's configured python (`python -m cluster.blas`, run by the
probe on hosts that are not Macs): `openblas PATH`, `reference`, `accelerate` or `other PATH`.
Optional: snapshots without it (every Mac snapshot) say nothing about BLAS. With the reference
BLAS a matmul costs the same per row whatever the row count, so a forward over k tokens costs k×
one token (prompt processing, batches, speculative decoding's checks); OpenBLAS, preloaded by
the rank in its place (cluster/blas.py), does k rows for little more than one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from topology.facts import HostFacts
from topology.finding import NO_BACKEND, Finding
from topology.parse import ParseError

KINDS_WITH_PATH = ("openblas", "other")
KINDS = ("reference", "accelerate", *KINDS_WITH_PATH)
_PATH_RE = re.compile(r"/[^\s\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]{0,4095}")


def parse_blas(text: str) -> str:
    """blas.txt → `kind` or `kind PATH`, checked whole."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ParseError(f"expected one line, got {len(lines)}")
    kind, _, path = lines[0].partition(" ")
    if kind not in KINDS:
        raise ParseError(f"{kind[:40]!r} is not one of {', '.join(KINDS)}")
    if (kind in KINDS_WITH_PATH) != bool(path) or (path and not _PATH_RE.fullmatch(path)):
        what = "an absolute library path" if kind in KINDS_WITH_PATH else "nothing"
        raise ParseError(f"{kind} must be followed by {what}")
    return lines[0]


def blas_findings(hosts: Sequence[HostFacts]) -> list[Finding]:
    """reference_blas (a warning: it blocks nothing) per Linux host whose ranks would use the
    reference BLAS."""
    return [
        Finding(
            "reference_blas",
            (h.name,),
            f"{h.name}: ranks there would use the reference BLAS bundled with mlx[cpu] (no "
            "OpenBLAS installed): every forward over k tokens costs k× one token",
            f"On {h.name}, install libopenblas0-pthread (Debian/Ubuntu: `sudo apt-get install "
            "libopenblas0-pthread`; Fedora: openblas-threads) so ranks use OpenBLAS.",
            NO_BACKEND,
        )
        for h in hosts
        if not h.is_mac and h.blas == "reference"
    ]
