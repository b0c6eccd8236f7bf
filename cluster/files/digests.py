"""sha256 of a file, computed once per version of the file.

Manifests and the ranks' checks hash multi-GB weights; doing it on every launch would cost
seconds per GB. A digest is remembered under cache_root()/digests/ together with the file's
identity (device, inode, size, mtime): any change to the file makes the entry stale, so a
modified file is hashed again. Entries are written atomically, so processes may share them.
No MLX here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from cluster.files.cache import cache_root

CHUNK = 8 << 20  # hashing reads this much at a time
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _entry(path: Path) -> Path:
    """The cache entry of a resolved path: one small JSON file, named by the path's hash."""
    key = hashlib.sha256(os.fsencode(path)).hexdigest()[:32]
    return cache_root() / "digests" / f"{key}.json"


def _identity(st: os.stat_result) -> dict[str, int]:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _cached(path: Path, identity: dict[str, int]) -> str | None:
    """The remembered digest of this version of the file; None when absent, stale or corrupt."""
    try:
        raw: Any = json.loads(_entry(path).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("path") != str(path):
        return None
    if any(raw.get(k) != v for k, v in identity.items()):
        return None
    digest = raw.get("sha256")
    return digest if isinstance(digest, str) and _SHA256.fullmatch(digest) else None


def _remember(path: Path, identity: dict[str, int], digest: str) -> None:
    """Best effort: a cache that cannot be written only costs a hash on the next launch."""
    entry = _entry(path)
    data = json.dumps({"path": str(path), **identity, "sha256": digest}).encode()
    with contextlib.suppress(OSError):
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, entry)  # readers see the old entry or the new one, never half
        except OSError:
            os.unlink(tmp)
            raise


def file_sha256(path: Path) -> str:
    """The file's sha256 (64 lowercase hex), from the cache when this version was hashed before.
    OSError when the file cannot be read."""
    real = path.resolve()
    with open(real, "rb", buffering=0) as f:
        before = _identity(os.fstat(f.fileno()))
        if (digest := _cached(real, before)) is not None:
            return digest
        h = hashlib.sha256()
        buf = memoryview(bytearray(CHUNK))
        while n := f.readinto(buf):
            h.update(buf[:n])
        digest = h.hexdigest()
        # Remembered only when the file did not change while it was read.
        if _identity(os.fstat(f.fileno())) == before:
            _remember(real, before, digest)
    return digest


def remember_sha256(path: Path, sha256: str) -> None:
    """Record the digest of a file the caller just wrote and hashed (e.g. a download), so the
    next launch does not read it again. The file must not change after this call."""
    real = path.resolve()
    with contextlib.suppress(OSError):
        _remember(real, _identity(real.stat()), sha256)


def remembered(path: Path) -> bool:
    """Is this version of the file's digest known (no hashing needed)?"""
    real = path.resolve()
    try:
        return _cached(real, _identity(real.stat())) is not None
    except OSError:
        return False
