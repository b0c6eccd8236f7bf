"""Read a tensor-parallel rank's slices of a weight from its safetensors file, not the whole weight.

MLX reads a lazily loaded tensor whole before any slice of it (a 1/8 row slice of a 256 MB tensor
peaked at 256 MB), so a rank with a small share would still read every byte of every layer.
Here the file's header gives each tensor's place; the file is memory-mapped and only the rows
(or column ranges) of the share are copied out, so the pages read are the share's own. A tensor
this cannot serve exactly — another name after mlx-lm's sanitize(), another dtype or shape than
the loaded parameter — returns None and the caller slices the loaded one as before.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

# safetensors dtype -> (numpy dtype to read the bytes as, the MLX dtype they are)
DTYPES: dict[str, tuple[type[np.generic], mx.Dtype]] = {
    "F32": (np.float32, mx.float32),
    "F16": (np.float16, mx.float16),
    "BF16": (np.uint16, mx.bfloat16),  # numpy has no bfloat16: the bits, viewed in MLX
    "U32": (np.uint32, mx.uint32),
    "I32": (np.int32, mx.int32),
    "U8": (np.uint8, mx.uint8),
}
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit


@dataclass(frozen=True)
class _Entry:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # of the tensor's first byte in the file


class SliceReader:
    """Where every tensor of these safetensors files is, by name."""

    def __init__(self, files: Iterable[Path]) -> None:
        self._entries: dict[str, _Entry] = {}
        for path in files:
            try:
                self._entries.update(_header(path))
            except (OSError, ValueError, KeyError, TypeError):  # unreadable: slices come from MLX
                continue

    def rows(
        self, name: str, like: mx.array, rows: Sequence[int], axis: int = -2
    ) -> mx.array | None:
        """like's entries `rows` along `axis` (its rows by default: like[..., rows, :]), read
        from the file (None: read it the usual way)."""
        data = self._map(name, like)
        if data is None or not -like.ndim <= axis < like.ndim:
            return None
        return self._array(np.take(data, np.asarray(rows), axis=axis), name)

    def columns(
        self, name: str, like: mx.array, spans: Sequence[tuple[int, int]]
    ) -> mx.array | None:
        """The column ranges of like (its last axis), joined, read from the file."""
        data = self._map(name, like)
        if data is None:
            return None
        parts = [data[..., a:b] for a, b in spans]
        return self._array(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1), name)

    def _map(self, name: str, like: mx.array) -> np.ndarray | None:
        entry = self._entries.get(name)
        if entry is None or entry.dtype not in DTYPES:
            return None
        np_dtype, mx_dtype = DTYPES[entry.dtype]
        if entry.shape != tuple(like.shape) or mx_dtype != like.dtype:
            return None  # sanitize() changed it: only the loaded parameter is right
        return np.memmap(entry.path, np_dtype, "r", entry.offset, entry.shape)

    def _array(self, picked: np.ndarray, name: str) -> mx.array:
        out = mx.array(np.ascontiguousarray(picked))  # copies the pages touched, no more
        if self._entries[name].dtype == "BF16":
            out = out.view(mx.bfloat16)
        return out


def _header(path: Path) -> dict[str, _Entry]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > MAX_HEADER_BYTES:
            raise ValueError("header too large")
        header = json.loads(f.read(size))
    start = 8 + size
    return {
        name: _Entry(
            path,
            str(info["dtype"]),
            tuple(int(d) for d in info["shape"]),
            start + int(info["data_offsets"][0]),
        )
        for name, info in header.items()
        if name != "__metadata__"
    }
