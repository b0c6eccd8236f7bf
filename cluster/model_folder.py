"""Writing a model folder that mlx-lm loads (tiny-model, import-gguf): weights split one file
per layer with the index (a pipeline rank reads only its layers' files), written into a temporary
folder beside the target and renamed into place, so a failure leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import mlx.core as mx

from topology.errors import InputError

T = TypeVar("T")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def write_folder(out: Path, fill: Callable[[Path], T]) -> T:
    """fill(a fresh temporary folder beside `out`), then that folder becomes `out`; on any
    failure (Ctrl-C and MemoryError too) the temporary folder and the parents made here go."""
    created = _make_parents(out.parent)
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        result = fill(tmp)
        _move_into_place(tmp, out)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for parent in created:  # deepest first; only the ones made here
            with contextlib.suppress(OSError):
                parent.rmdir()
        if isinstance(e, OSError):
            raise InputError(f"{out}: cannot write the model ({e.strerror or e})") from None
        raise
    return result


def _make_parents(parent: Path) -> list[Path]:
    """Create the missing parent directories; the ones created, deepest first."""
    missing: list[Path] = []
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    try:
        for d in reversed(missing):
            d.mkdir()
    except OSError as e:
        for d in missing:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise InputError(f"{missing[0]}: cannot create the directory ({e.strerror or e})") from None
    return missing


def _move_into_place(tmp: Path, out: Path) -> None:
    """rename(2) replaces an empty directory at once; an old model is moved aside first."""
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; a model directory is read by others too
    if not out.exists() or not any(out.iterdir()):
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.replace(out, old)  # an empty directory: out takes its place
    try:
        os.replace(tmp, out)
    except OSError:
        os.replace(old, out)  # put the old model back
        raise
    shutil.rmtree(old, ignore_errors=True)


def save_weights_by_layer(out: Path, weights: dict[str, mx.array], layers: int) -> tuple[int, int]:
    """File 1 holds everything outside the layers, file i+2 layer i, and the index names them;
    one file evaluated at a time (converted copies never all coexist). (files, bytes)."""
    total = layers + 1
    shards: list[dict[str, mx.array]] = [{} for _ in range(total)]
    for name, value in weights.items():
        match = _LAYER.search(name)
        shards[0 if match is None else int(match.group(1)) + 1][name] = value
    weight_map: dict[str, str] = {}
    size = 0
    for i, shard in enumerate(shards):
        file_name = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        mx.eval(shard)
        size += sum(v.nbytes for v in shard.values())
        try:
            mx.save_safetensors(str(out / file_name), shard, metadata={"format": "mlx"})
        except RuntimeError as e:  # MLX reports a failed open or write this way
            raise OSError(str(e)) from None
        weight_map |= dict.fromkeys(shard, file_name)
    index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total, size
