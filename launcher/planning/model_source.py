"""Find a model's config.json (+ safetensors index) in a local directory or the Hugging Face Hub.

Planning reads only these two JSON files, never weights. For a repo id the Hub cache is tried
first, then huggingface_hub downloads just that file; offline and not cached is one clear error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cluster.files.hub_fetch import hub_reachable
from topology.errors import InputError
from topology.model.spec import ModelSpec, spec_from_config
from topology.untrusted import load_json

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
# A config.json is a few KB; an index lists every tensor (a 1T-parameter model's: ~20 MB).
MAX_CONFIG_BYTES = 8 << 20
MAX_INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "dir" | "hub"
    id: str  # absolute directory path or "org/name"


def resolve_model(model: str) -> ModelSource:
    """A local directory (as an absolute path) or a Hugging Face repo id; InputError otherwise."""
    if not model or not model.strip():
        raise InputError("--model: give a model directory or a Hugging Face repo id (org/name)")
    path = Path(model).expanduser()
    if path.is_dir():
        return ModelSource("dir", str(path.resolve()))
    if path.exists():
        raise InputError(
            f"--model {model}: is a file; give the model's directory (with config.json)"
        )
    if _REPO_ID.fullmatch(model):  # exactly one "/", no leading "." "/" "~": not a path
        return ModelSource("hub", model)
    raise InputError(
        f"--model {model}: no such directory, and not a Hugging Face repo id (org/name)"
    )


def read_json(path: Path, label: str, max_bytes: int) -> Any:
    """The file's JSON value, through the parser boundary (size, depth, UTF-8, numbers)."""
    try:
        with path.open("rb") as f:
            # never more than the limit, whatever the file holds; and no buffer of the limit's
            # size for a small file (a 64 MiB one per plan, for an index of a few kB)
            size = os.fstat(f.fileno()).st_size
            data = f.read(min(max_bytes, size) + 1)
    except OSError as e:
        raise InputError(f"{label}: cannot read it ({e.__class__.__name__}: {e})") from None
    return load_json(data, label, max_bytes=max_bytes)


def _offline(repo: str) -> InputError:
    from huggingface_hub import constants

    why = (
        "the Hub is off (--no-hub or HF_HUB_OFFLINE)"
        if constants.HF_HUB_OFFLINE
        else "cannot reach the Hugging Face Hub"
    )
    return InputError(
        f"'{repo}' is not in the Hugging Face cache and {why}: download it first with "
        f"`hf download {repo} --include '*.json'` or pass a local directory"
    )


def hub_file(repo: str, filename: str, required: bool) -> Path | None:
    """The cached (or freshly downloaded) file, None when an optional file does not exist."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    cached = try_to_load_from_cache(repo, filename)
    if isinstance(cached, str):
        return Path(cached)
    if cached is not None and not required:  # the cache knows the Hub has no such file
        return None
    if not hub_reachable():  # a quick TCP check: no ~25 s of huggingface_hub retries
        if required:
            raise _offline(repo)
        return None
    try:
        return Path(hf_hub_download(repo, filename))
    except GatedRepoError:
        raise InputError(
            f"'{repo}' is gated on the Hugging Face Hub: accept its terms on the model page and "
            "log in with `hf auth login`"
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            f"'{repo}' is not on the Hugging Face Hub (or is private: log in with `hf auth login`)"
        ) from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        if required:
            raise _offline(repo) from None
        return None  # config came from the cache; the index simply is not there
    except EntryNotFoundError:
        if required:
            raise InputError(f"'{repo}' has no {filename} on the Hugging Face Hub") from None
        return None
    except OSError:  # connection problems surface as OSError subclasses (HTTPError, ...)
        raise _offline(repo) from None


def load_model_spec(model: str) -> ModelSpec:
    """The ModelSpec of a directory or repo id, its `source` set to the resolved model."""
    src = resolve_model(model)
    config_path: Path | None
    index_path: Path | None
    if src.kind == "dir":
        directory = Path(src.id)
        config_path, label = directory / CONFIG, str(directory / CONFIG)
        if not config_path.is_file():
            raise InputError(f"--model {model}: no {CONFIG} in {src.id}: not a model directory")
        index_path = directory / INDEX if (directory / INDEX).is_file() else None
    else:
        config_path, label = hub_file(src.id, CONFIG, required=True), f"{src.id}/{CONFIG}"
        index_path = hub_file(src.id, INDEX, required=False)
    if config_path is None:
        raise _offline(src.id)
    config = read_json(config_path, label, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise InputError(f"{label}: must be a JSON object")
    index = None
    if index_path is not None:
        index_label = label.replace(CONFIG, INDEX)
        index = read_json(index_path, index_label, MAX_INDEX_BYTES)
        if not isinstance(index, dict):
            raise InputError(f"{index_label}: must be a JSON object")
    return replace(spec_from_config(config, index, source=label), source=src.id)
