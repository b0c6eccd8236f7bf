"""A repo in a Hugging Face cache, laid out as huggingface_hub leaves it, written offline."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from pathlib import Path


def write_hub_cache(
    hf_home: Path, repo: str, folder: Path, only: Collection[str] | None = None
) -> None:
    """`repo` as huggingface_hub lays it out after downloading all its files (or `only` these):
    blobs named by their sha256, a snapshot of symlinks to them, refs/main naming the commit."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
    commit = hashlib.sha1(json.dumps(sorted(files)).encode()).hexdigest()
    (root / "blobs").mkdir(parents=True)
    (root / "snapshots" / commit).mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for name, data in files.items():
        if only is not None and name not in only:
            continue
        sha = hashlib.sha256(data).hexdigest()
        (root / "blobs" / sha).write_bytes(data)
        (root / "snapshots" / commit / name).symlink_to(f"../../blobs/{sha}")
