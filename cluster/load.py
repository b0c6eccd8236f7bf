"""Load this rank's shard of a model through mlx-lm, reading only the files it needs.

Shapes are checked from config.json before any weight is read, because mlx-lm's `shard()`
accepts KV heads that do not divide the rank count and only fails at the first forward.
The weights come from a private "view" directory of symlinks to config/tokenizer files and
this rank's safetensors files, so mlx-lm's loader (which globs model*.safetensors) sees
exactly those; each layer is then materialised in turn so loading can report progress.
Files are found as mlx-lm's sharded_load does, metadata first, then only this rank's
safetensors files: on this host, from the launching host, or from the Hub
(cluster/files/model_files.py).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import _get_classes, load_config, load_model, load_tokenizer

from cluster.files.hub_fetch import DownloadProgress
from cluster.files.model_files import MissingFiles, ModelFiles, PeerShare
from cluster.files.peer_fetch import FetchReport
from cluster.job import RankJob
from cluster.pipeline_stage import PipelineStage, check_generic, layer_range
from cluster.slice_reader import SliceReader
from cluster.tensor_shards import shard_model
from topology.errors import InputError
from topology.model.spec import UNEVEN_FAMILIES, spec_from_config
from topology.planning.tensor_costs import grid_for, tensor_layout, widths_for
from topology.planning.tensor_shares import HeadGrid, RankShare, check_cover
from topology.planning.types import DEFAULT_CONTEXT
from topology.untrusted import load_json, show

Progress = Callable[[int, int, int], None]  # (layers loaded, layers total, files)
LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Shard:
    model: nn.Module
    tokenizer: TokenizerWrapper
    config: dict[str, Any]
    layers: tuple[int, int]  # this rank's [start, end) in mlx-lm's numbering
    files: tuple[str, ...]  # the safetensors files it read
    fetched: FetchReport  # what came over the network from a peer (all zero: nothing)


def check_shapes(
    config: dict[str, Any], strategy: str, size: int, split: Sequence[int] | None
) -> None:
    """Refuse, before loading, a pipeline split that mlx-lm would get wrong or fail on late
    (a tensor share is checked when it is laid out: `tensor_share`)."""
    if size == 1:
        return
    layers = int(config["num_hidden_layers"])
    if strategy == "pipeline":
        if split is None and size > layers:
            raise InputError(
                f"pipeline over {size} ranks needs at least {size} layers (model has {layers})"
            )
        if split is not None and (len(split) != size or min(split) < 1 or sum(split) != layers):
            raise InputError(
                f"layer split {list(split)} must give each of {size} ranks at least one layer "
                f"and add up to {layers}"
            )
        return
    if strategy != "tensor":
        raise InputError(f"unknown strategy {strategy!r}: use tensor or pipeline")


def tensor_share(
    config: dict[str, Any],
    rank: int,
    size: int,
    given: dict[str, Any] | None,
    every: list[dict[str, Any]] | None = None,
) -> tuple[RankShare, HeadGrid]:
    """This rank's share: the plan's, checked against the model (and, given every rank's,
    checked to cover it exactly once), or equal shares."""
    spec = spec_from_config(config)
    grid = grid_for(spec, DEFAULT_CONTEXT)
    widths = widths_for(spec)
    if every is not None:
        if len(every) != size or (given is not None and every[rank] != given):
            raise InputError(f"tensor shares for {len(every)} ranks do not match the job (re-plan)")
        check_cover([RankShare.from_json(s, grid, widths) for s in every], grid, widths)
    if given is not None:
        return RankShare.from_json(given, grid, widths), grid
    lay = tensor_layout(spec, [1.0] * size, DEFAULT_CONTEXT)
    if isinstance(lay, str):
        raise InputError(
            f"tensor parallel over {size} ranks needs {lay}: use fewer ranks or --strategy pipeline"
        )
    return lay.shares[rank], grid


def local_files(
    path: Path, layers: range | None, weights: Iterable[str] | None = None
) -> list[str]:
    """Safetensors files holding the non-layer weights and `layers` (None: all files).
    Without an index: every model*.safetensors file, of `weights` when given (a Hub repo
    whose weights are not downloaded yet), else of the folder."""
    index_file = path / "model.safetensors.index.json"
    if not index_file.is_file():
        if weights is not None:
            return sorted(weights)
        return sorted(p.name for p in path.glob("model*.safetensors"))
    files = set()
    for name, file in _weight_map(index_file).items():
        match = LAYER_KEY.search(name)
        if layers is None or match is None or int(match.group(1)) in layers:
            files.add(file)
    return sorted(files)


_INDEX_MAX_BYTES = 64 << 20  # a 1T-parameter model's index is ~20 MB
_WEIGHT_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,200}\.safetensors")


def _weight_map(index_file: Path) -> dict[str, str]:
    """The index's tensor -> file map, through the parser boundary: every file a plain name in
    the model folder (never a path), every layer number short enough to read."""
    try:
        with index_file.open("rb") as f:
            data = f.read(_INDEX_MAX_BYTES + 1)
    except OSError as e:
        raise InputError(f"{index_file}: cannot read it ({e.strerror})") from None
    raw = load_json(data, str(index_file), max_bytes=_INDEX_MAX_BYTES)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        raise InputError(f"{index_file}: weight_map: missing (not a safetensors index)")
    for name, file in weight_map.items():
        if not isinstance(file, str) or not _WEIGHT_FILE.fullmatch(file):
            raise InputError(
                f"{index_file}: weight_map: {show(name)} -> {show(file)} is not a "
                "safetensors file name in the model folder"
            )
        match = LAYER_KEY.search(name)
        if match is not None and len(match.group(1)) > 6:
            raise InputError(f"{index_file}: weight_map: {show(name)}: layer number too long")
    return weight_map


def load_shard(
    model: str,
    rank: int,
    size: int,
    strategy: str,
    group: Any,
    split: Sequence[int] | None = None,
    share: dict[str, Any] | None = None,
    layout: list[dict[str, Any]] | None = None,
    progress: Progress | None = None,
    download_progress: DownloadProgress | None = None,
    peers: PeerShare | None = None,
    hub: bool = True,
) -> Shard:
    source = ModelFiles(model, peers, hub, download_progress)
    view = Path(tempfile.mkdtemp(prefix=f"mlx-cluster-load{rank}-"))
    try:
        _link(view, source.metadata())
        config = load_config(view)
        arch = _architecture(config, source.folder or Path(model))
        check_shapes(arch, strategy, size, split)
        try:
            model_class, _ = _get_classes(config)
        except ValueError as e:  # "Model type X not supported."
            raise InputError(f"{model}: {e} (by the installed mlx-lm)") from None
        num_layers = int(arch["num_hidden_layers"])
        pipeline = size > 1 and strategy == "pipeline"
        tensor = size > 1 and strategy == "tensor"
        if tensor and not hasattr(model_class, "shard"):
            raise InputError(
                f"mlx-lm has no tensor parallel for {config['model_type']}: use --strategy pipeline"
            )
        own = tensor_share(arch, rank, size, share, layout) if tensor else None
        local = layer_range(num_layers, rank, size, split) if pipeline else range(num_layers)
        files = local_files(view, local if pipeline else None, source.weight_names())
        if not files:
            raise InputError(
                f"{model} lacks any model*.safetensors (rank {rank}, "
                f"layers {local.start}-{local.stop - 1})"
            )
        try:
            source.obtain(files)
        except MissingFiles as e:
            raise InputError(f"{e} (rank {rank}, layers {local.start}-{local.stop - 1})") from None
        _link(view, {name: source.where[name] for name in files})
        net, config = load_model(view, lazy=True, strict=not pipeline)
        tokenizer = load_tokenizer(view, eos_token_ids=config.get("eos_token_id"))
        reader = SliceReader(view / name for name in files) if own else None
        net = _shard(net, group, strategy if size > 1 else "none", split, own, reader)
        _materialise(net, local, len(files), progress)
    finally:
        shutil.rmtree(view, ignore_errors=True)
    return Shard(net, tokenizer, config, (local.start, local.stop), tuple(files), source.fetched)


def shard_for_job(job: RankJob, group: Any, emit: Callable[..., None]) -> Shard:
    """The job's shard, loading progress and file transfers reported through `emit`."""
    peers = PeerShare.from_job(job.share) if job.share is not None else None
    return load_shard(
        job.model, job.rank, job.world_size, job.strategy, group, split=job.layer_split,
        share=job.tensor_share,
        layout=job.tensor_layout,
        progress=lambda done, total, files: emit(
            "loading", layers_done=done, layers_total=total, files=files
        ),
        download_progress=lambda step: emit("progress", stage="download", **step.fields()),
        peers=peers,
        hub=job.hub,
    )  # fmt: skip


def _link(view: Path, where: dict[str, Path]) -> None:
    """mlx-lm reads a folder: give it one of symlinks to exactly the files this rank loads."""
    for name, path in where.items():
        link = view / name
        if not link.exists():
            link.symlink_to(path.resolve())


def _architecture(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The decoder's settings: top level, or text_config for multimodal checkpoints."""
    arch = {**config.get("text_config", {}), **config}
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        if not isinstance(arch.get(key), int):
            raise InputError(f"{path}/config.json has no {key}: not a model mlx-cluster can shard")
    return arch


def _shard(
    net: nn.Module,
    group: Any,
    strategy: str,
    split: Sequence[int] | None,
    share: tuple[RankShare, HeadGrid] | None,
    reader: SliceReader | None = None,
) -> nn.Module:
    if strategy == "tensor" and share is not None and _uneven(net):
        shard_model(net, group, *share, reader=reader)
    elif strategy == "tensor":  # a family only mlx-lm's even shard() splits (the plan checked)
        net.shard(group)
    elif strategy == "pipeline" and hasattr(net.model, "pipeline"):
        net.model.pipeline(group, split=None if split is None else list(split))
    elif strategy == "pipeline":
        reason = check_generic(net)
        if reason is not None:
            raise InputError(f"{reason}: use --strategy tensor")
        return PipelineStage(net, group, split)
    return net


def _uneven(net: nn.Module) -> bool:
    family = type(net).__module__.rsplit(".", 1)[-1]
    return family in UNEVEN_FAMILIES


def _materialise(net: nn.Module, local: range, files: int, progress: Progress | None) -> None:
    """Read the weights layer by layer (lazy until now) and report each step."""
    layers = [layer for layer in _all_layers(net)[local.start : local.stop] if layer is not None]
    mx.eval([p for name, p in _flat(net.parameters()) if not LAYER_KEY.search(name)])
    for i, layer in enumerate(layers):
        mx.eval(layer.parameters())
        if progress is not None:
            progress(i + 1, len(layers), files)
    mx.eval(net.parameters())


def _all_layers(net: nn.Module) -> list[Any]:
    inner = net.model if hasattr(net, "model") else net
    return list(inner.layers)


def _flat(tree: Any) -> list[tuple[str, mx.array]]:
    return cast(list[tuple[str, mx.array]], tree_flatten(tree))
