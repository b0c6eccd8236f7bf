"""The GGUF container read by hand and bounds-checked, so MLX's loader only sees sound files.

Layout (llama.cpp's gguf.md): magic, version, tensor and key counts, the key/value metadata,
one info per tensor (name, dims innermost first, type, offset), padding, the tensor data.
Every length is checked against the file before it is used: a truncated download or a hostile
file is one clear error, never a read past the end inside MLX.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from topology.errors import InputError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 (2023) used 32-bit counts; nothing ships it any more
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 20
MAX_ITEMS = 1 << 24  # one metadata array (vocabularies are ~10^5..10^6 entries)
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32

# GGML tensor types: id -> (name, elements per block, bytes per block) for the ones MLX's
# loader reads (Q4_0/Q4_1/Q8_0 as its own affine quantization); names only for the rest.
SUPPORTED_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
OTHER_TYPES = {
    6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
    14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip

# Metadata value types: id -> struct format (8 string and 9 array are read apart).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"}
_SCALARS |= {10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?"}
_NUMPY |= {10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


def type_name(type_id: int) -> str:
    if type_id in SUPPORTED_TYPES:
        return SUPPORTED_TYPES[type_id][0]
    return OTHER_TYPES.get(type_id, f"type {type_id}")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # row-major, as MLX and safetensors see it (GGUF lists it reversed)
    type_id: int
    offset: int  # from the start of the data section
    nbytes: int | None  # None for a type MLX cannot read (refused by metadata.py)

    @property
    def type_name(self) -> str:
        return type_name(self.type_id)


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: Mapping[str, Any]  # numbers, bools, str; arrays as lists (numeric ones as ndarrays)
    tensors: Mapping[str, TensorInfo]


class _Truncated(Exception):
    """A length ran past the end of the file."""


class _Cursor:
    """Sequential little-endian reads from a buffer, each checked against its end."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.end = buf, 0, len(buf)

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > self.end:
            raise _Truncated
        start, self.pos = self.pos, self.pos + n
        return start

    def unpack(self, fmt: str) -> Any:
        start = self.take(struct.calcsize("<" + fmt))
        return struct.unpack_from("<" + fmt, self.buf, start)[0]

    def string(self, what: str) -> str:
        n = self.unpack("Q")
        start = self.take(n)
        try:
            return bytes(self.buf[start : start + n]).decode()
        except UnicodeDecodeError as e:
            raise InputError(f"{what}: not UTF-8 at byte {e.start}") from None


def read_header(path: Path) -> GGUFHeader:
    """The metadata and tensor infos of the GGUF file at `path`, every extent checked."""
    try:
        with path.open("rb") as f:
            if path.stat().st_size < 24:
                raise InputError(f"{path}: not a GGUF file (too short): give a .gguf model file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf)
    except OSError as e:
        raise InputError(f"{path}: cannot read the file ({e.strerror or e})") from None
    except _Truncated:
        raise InputError(
            f"{path}: the file ends early (truncated or corrupt): download it again"
        ) from None


def _parse(path: Path, buf: mmap.mmap) -> GGUFHeader:
    if buf[:4] != MAGIC:
        raise InputError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    cur = _Cursor(buf)
    cur.take(4)
    version, n_tensors, n_keys = cur.unpack("I"), cur.unpack("Q"), cur.unpack("Q")
    if version not in VERSIONS:
        raise InputError(f"{path}: GGUF version {version} is not supported (2 or 3 are)")
    if n_tensors > MAX_TENSORS or n_keys > MAX_KEYS:
        raise InputError(f"{path}: {n_tensors} tensors and {n_keys} keys: not a sane GGUF header")
    metadata: dict[str, Any] = {}
    for _ in range(n_keys):
        key = cur.string(f"{path}: a metadata key")
        metadata[key] = _value(cur, cur.unpack("I"), f"{path}: {key}")
    infos = [_tensor_info(cur, path) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
        raise InputError(f"{path}: general.alignment must be a power of two, got {alignment!r}")
    data_start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for info in infos:
        if info.name in tensors:
            raise InputError(f"{path}: tensor {info.name} appears twice")
        end = data_start + info.offset + (info.nbytes or 0)
        if info.offset % alignment or end > len(buf):
            raise _Truncated
        tensors[info.name] = info
    return GGUFHeader(path, version, metadata, tensors)


def _value(cur: _Cursor, kind: int, what: str) -> Any:
    if kind in _SCALARS:
        return cur.unpack(_SCALARS[kind])
    if kind == STRING:
        return cur.string(what)
    if kind != ARRAY:
        raise InputError(f"{what}: unknown metadata value type {kind}")
    item, count = cur.unpack("I"), cur.unpack("Q")
    if count > MAX_ITEMS:
        raise InputError(f"{what}: {count} items (at most {MAX_ITEMS})")
    if item in _NUMPY:  # a numeric array in one read: a vocabulary's types are ~10^5 entries
        dtype = np.dtype(_NUMPY[item])
        start = cur.take(count * dtype.itemsize)
        return np.frombuffer(cur.buf, dtype, count, start).copy()
    if item == STRING:
        return [cur.string(what) for _ in range(count)]
    raise InputError(f"{what}: arrays of type {item} are not supported")


def _tensor_info(cur: _Cursor, path: Path) -> TensorInfo:
    name = cur.string(f"{path}: a tensor name")
    n_dims = cur.unpack("I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise InputError(f"{path}: tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = [cur.unpack("Q") for _ in range(n_dims)]
    type_id, offset = cur.unpack("I"), cur.unpack("Q")
    if any(not 1 <= d <= 1 << 40 for d in dims):
        raise InputError(f"{path}: tensor {name} has a bad size {dims}")
    nbytes = None
    if type_id in SUPPORTED_TYPES:
        _, block, block_bytes = SUPPORTED_TYPES[type_id]
        if dims[0] % block:
            raise InputError(
                f"{path}: tensor {name}: {dims[0]} columns is not a multiple of the "
                f"{type_name(type_id)} block size {block}"
            )
        nbytes = int(np.prod(dims, dtype=np.uint64)) // block * block_bytes
    return TensorInfo(name, tuple(reversed(dims)), type_id, offset, nbytes)
