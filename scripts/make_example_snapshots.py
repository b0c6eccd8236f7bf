"""Regenerate the example snapshots in hostfiles/snapshots/ from tests/synth.py.

    .venv/bin/python scripts/make_example_snapshots.py

- mesh-4x-m3-ultra: 4 Mac Studio M3 Ultra, full mesh, RDMA on, macOS 26.2 (ready for jaccl).
- mesh-3x-m3-ultra: 3 of them (tensor parallel over a rank count no model's heads divide).
- mixed-3x: 2 M3 Ultra Mac Studios and an M4 Max Mac Studio in a full mesh (unequal shares).
- mesh-8x-m3-ultra: 8 M3 Ultra. A full mesh of 8 needs 7 RDMA ports per Mac and an M3 Ultra has
  5 (of its 6 ports, the one next to Ethernet does no RDMA), so each Mac is cabled to 5 of the 7
  others (20 cables; the pairs 3 apart in name order are not): jaccl is impossible (8 pairs
  uncabled, no free RDMA port), jaccl-ring works (many RDMA rings exist).
- mesh-4x-needs-fixes: 4 M3 Ultra with RDMA disabled on studio-c, no cable between studio-b and
  studio-d, studio-a's Thunderbolt ports inside an active bridge0 (so those cables have no
  address), one 40 Gb/s cable.

Every healthy example leaves each Mac Studio's RDMA-less port (en2) free, and every host records
versions.txt (the same versions everywhere).
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


VERSIONS: dict[str, str | None] = {
    "python": "3.12.7",
    "mlx": "0.32.2",
    "mlx-lm": "0.32.2",
    "mlx-cluster": "0.1.0",
}


def _with_ssh(c: synth.Cluster) -> synth.Cluster:
    for h in c.hosts:
        h.ssh = f"{h.name}.local"
        h.versions = dict(VERSIONS)
    return c


def mesh_4x() -> synth.Cluster:
    return _with_ssh(synth.mesh(4))


def mesh_3x() -> synth.Cluster:
    return _with_ssh(synth.mesh(3))


def mixed_3x() -> synth.Cluster:
    c = synth.Cluster(
        [
            synth.SynthHost("studio-a", "m3-ultra"),
            synth.SynthHost("studio-b", "m3-ultra"),
            synth.SynthHost("studio-max", "m4-max"),
        ]
    )
    for a, b in [("studio-a", "studio-b"), ("studio-b", "studio-max"), ("studio-max", "studio-a")]:
        c.cable(a, b)
    return _with_ssh(c)


def mesh_8x() -> synth.Cluster:
    c = synth.cluster(8)
    names = [h.name for h in c.hosts]
    unpaired = {frozenset((names[i], names[(i + 3) % 8])) for i in range(8)}  # a-d, b-e, ...
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if frozenset((a, b)) not in unpaired:
                c.cable(a, b)
    return _with_ssh(c)


def needs_fixes() -> synth.Cluster:
    c = synth.cluster(4)
    c.host("studio-c").rdma = False
    c.host("studio-a").bridge = (2, 3)  # two of its cables (port 1 is en2, left free)
    for a, b in [("studio-a", "studio-b"), ("studio-a", "studio-c"), ("studio-a", "studio-d")]:
        c.cable(a, b)
    c.cable("studio-b", "studio-c", speed=40.0)
    c.cable("studio-c", "studio-d")
    return _with_ssh(c)  # studio-b <-> studio-d: no cable


def main() -> None:
    for name, build in [
        ("mesh-4x-m3-ultra", mesh_4x),
        ("mesh-3x-m3-ultra", mesh_3x),
        ("mixed-3x", mixed_3x),
        ("mesh-8x-m3-ultra", mesh_8x),
        ("mesh-4x-needs-fixes", needs_fixes),
    ]:
        target = OUT / name
        shutil.rmtree(target, ignore_errors=True)
        build().write(target)
        print(f"wrote {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
