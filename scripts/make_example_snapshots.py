"""Regenerate the example snapshots in hostfiles/snapshots/ from tests/synth.py.

    .venv/bin/python scripts/make_example_snapshots.py

- mesh-4x-m3-ultra: 4 Mac Studio M3 Ultra, full mesh, RDMA on, macOS 26.2 (ready for jaccl).
- mesh-8x-m3-ultra: 8 M3 Ultra. A full mesh of 8 needs 7 ports per Mac and an M3 Ultra has 6, so
  each Mac is cabled to 6 of the 7 others (all ports used, 24 cables): jaccl is impossible (4 pairs
  uncabled, no free port), jaccl-ring works (many RDMA rings exist).
- mesh-4x-needs-fixes: 4 M3 Ultra with RDMA disabled on studio-c, no cable between studio-b and
  studio-d, studio-a's Thunderbolt ports inside an active bridge0, one 40 Gb/s cable.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import synth  # noqa: E402

OUT = ROOT / "hostfiles" / "snapshots"


def _with_ssh(c: synth.Cluster) -> synth.Cluster:
    for h in c.hosts:
        h.ssh = f"{h.name}.local"
    return c


def mesh_4x() -> synth.Cluster:
    return _with_ssh(synth.mesh(4))


def mesh_8x() -> synth.Cluster:
    c = synth.cluster(8)
    names = [h.name for h in c.hosts]
    unpaired = {frozenset((names[i], names[i + 4])) for i in range(4)}  # a-e, b-f, c-g, d-h
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if frozenset((a, b)) not in unpaired:
                c.cable(a, b)
    return _with_ssh(c)


def needs_fixes() -> synth.Cluster:
    c = synth.cluster(4)
    c.host("studio-c").rdma = False
    c.host("studio-a").bridge = (1, 2)
    for a, b in [("studio-a", "studio-b"), ("studio-a", "studio-c"), ("studio-a", "studio-d")]:
        c.cable(a, b)
    c.cable("studio-b", "studio-c", speed=40.0)
    c.cable("studio-c", "studio-d")
    return _with_ssh(c)  # studio-b <-> studio-d: no cable


def main() -> None:
    for name, build in [
        ("mesh-4x-m3-ultra", mesh_4x),
        ("mesh-8x-m3-ultra", mesh_8x),
        ("mesh-4x-needs-fixes", needs_fixes),
    ]:
        target = OUT / name
        shutil.rmtree(target, ignore_errors=True)
        build().write(target)
        print(f"wrote {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
