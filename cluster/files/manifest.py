"""What a model is, file by file: name, size and sha256 of every file a rank may need.

The launcher builds a manifest of the model it serves to its ranks (peer_fetch.py);
each rank checks what it loads against it, so every host runs the same bytes. A Hugging Face
cache names LFS blobs by their sha256, so those cost nothing; every other file is hashed once
and remembered by digests.py. No MLX here: the launcher imports this module.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.files.digests import file_sha256

_SHA256 = re.compile(r"[0-9a-f]{64}")
# A plain file name in the model folder: never a path, never hidden, never a partial download.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,200}")


def safe_name(name: str) -> str:
    """A model's name as a plain folder name (its copies live in cache_root()/models/)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip("._-")[:100]
    return cleaned or "model"


def is_model_file_name(name: str) -> bool:
    return bool(_FILE_NAME.fullmatch(name)) and not name.endswith((".part", ".lock"))


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str  # 64 lowercase hex


@dataclass(frozen=True)
class Manifest:
    name: str  # the folder name, or "org--name" for a Hugging Face repo
    files: Mapping[str, FileEntry]

    @property
    def digest(self) -> str:
        """16 hex digits naming exactly these files' contents."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            entry = self.files[name]
            h.update(f"{name}\0{entry.size}\0{entry.sha256}\n".encode())
        return h.hexdigest()[:16]

    @property
    def folder(self) -> str:
        """Where a host keeps its copy, under cache_root()/models/."""
        return f"{self.name}-{self.digest}"

    def to_json(self) -> dict[str, Any]:
        files = {n: [e.size, e.sha256] for n, e in sorted(self.files.items())}
        return {"name": self.name, "files": files}

    @classmethod
    def from_json(cls, raw: Any) -> Manifest:
        """From the launcher's job line; ValueError when it is not a manifest."""
        if not isinstance(raw, dict) or not isinstance(raw.get("files"), dict):
            raise ValueError("manifest: expected {name, files}")
        name = raw.get("name")
        if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
            raise ValueError(f"manifest: name {name!r} is not a plain folder name")
        files: dict[str, FileEntry] = {}
        for file, value in raw["files"].items():
            if not is_model_file_name(file):
                raise ValueError(f"manifest: {file!r} is not a file name in the model folder")
            ok = isinstance(value, list) and len(value) == 2
            size, digest = (value[0], value[1]) if ok else (None, None)
            if not (isinstance(size, int) and size >= 0 and isinstance(digest, str)):
                raise ValueError(f"manifest: {file}: expected [size, sha256]")
            if not _SHA256.fullmatch(digest):
                raise ValueError(f"manifest: {file}: {digest!r} is not a sha256")
            files[file] = FileEntry(size, digest)
        return cls(name, files)


def folder_manifest(folder: Path, name: str | None = None) -> tuple[Manifest, dict[str, Path]]:
    """The manifest of a model folder's top-level files, and where each file is.

    A symlink into a Hugging Face cache blob named by a sha256 takes that digest (the Hub
    checked it when it downloaded); any other file is hashed (once: digests.py)."""
    where: dict[str, Path] = {}
    files: dict[str, FileEntry] = {}
    for item in sorted(folder.iterdir()):
        if not is_model_file_name(item.name) or not item.is_file():
            continue
        real = item.resolve()
        size = real.stat().st_size
        blob = real.name if real.parent.name == "blobs" and _SHA256.fullmatch(real.name) else None
        files[item.name] = FileEntry(size, blob or file_sha256(real))
        where[item.name] = real
    return Manifest(safe_name(name or folder.name), files), where
