"""Bring a Hugging Face model's files onto this host: metadata first, then only some weights.

As mlx-lm's `sharded_load` does: the config, tokenizer and index files come first (no weights),
so the caller can work out which safetensors files its shard reads; only those are downloaded,
one by one, with progress. The local cache is tried first: a fully cached model costs no network
call. Before going online, one quick TCP connect decides whether the Hub is reachable at all,
because huggingface_hub retries a dead network for ~25 s with a warning per try.
No MLX here: the launcher imports `hub_reachable` from this module.
"""

from __future__ import annotations

import fnmatch
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from topology.errors import InputError

# mlx_lm.utils.sharded_load's allow_patterns (mlx-lm 0.32.2): everything but the weights.
META_PATTERNS = (
    "*.json",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
)
WEIGHTS = "model*.safetensors"
CONNECT_TIMEOUT_S = 5.0
TICK_S = 2.0  # while a file downloads, report its bytes this often (when they moved)


@dataclass(frozen=True)
class DownloadStep:
    """`done` of `total` files are downloaded; `file` is the one in flight or just finished."""

    done: int
    total: int
    file: str
    bytes: int | None = None  # of `file`, received so far
    size: int | None = None  # of `file`, when the Hub's listing says
    received: int | None = None  # of all `total` files so far (a copy from a peer says)
    expected: int | None = None  # of all `total` files

    def fields(self) -> dict[str, Any]:
        """The event fields (launcher side: `progress` with stage "download")."""
        out: dict[str, Any] = {"done": self.done, "total": self.total, "file": self.file}
        sizes = {"bytes": self.bytes, "size": self.size}
        sizes |= {"received": self.received, "expected": self.expected}
        return out | {k: v for k, v in sizes.items() if v is not None}


DownloadProgress = Callable[[DownloadStep], None]  # may be called from a helper thread


@dataclass(frozen=True)
class HubSnapshot:
    """One commit of a repo in the local cache, holding at least its metadata files."""

    repo: str
    path: Path  # .../snapshots/<commit>
    sizes: Mapping[str, int] | None  # every file of the repo and its size; None: not known

    def weight_files(self) -> list[str]:
        """The repo's top-level model*.safetensors files, from its listing or the folder."""
        names: Iterable[str] = (
            self.sizes if self.sizes is not None else (p.name for p in self.path.iterdir())
        )
        return sorted(n for n in names if "/" not in n and fnmatch.fnmatch(n, WEIGHTS))


def hub_reachable() -> bool:
    """One quick TCP connect to the Hub endpoint (False at once under HF_HUB_OFFLINE).
    Also silences huggingface_hub's logging: its retry warnings would break one-line errors."""
    from huggingface_hub import constants
    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if constants.HF_HUB_OFFLINE:
        return False
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def cannot_download(repo: str, why: str) -> InputError:
    return InputError(
        f"cannot download {repo} on this host ({why}): check the network or run "
        f"`hf download {repo}` on it, or pass a local folder"
    )


def _offline_reason() -> str:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    return f"{constants.ENDPOINT} is unreachable"


def _download_error(repo: str, error: Exception, file: str | None = None) -> InputError:
    """One line for whatever huggingface_hub raised while downloading."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(error, GatedRepoError):
        return InputError(
            f"{repo} is gated on the Hugging Face Hub: accept its terms on the model page and "
            "log in on this host with `hf auth login`"
        )
    if isinstance(error, RepositoryNotFoundError):
        return InputError(
            f"{repo} is not on the Hugging Face Hub (or is private: log in on this host with "
            "`hf auth login`)"
        )
    if isinstance(error, RemoteEntryNotFoundError):
        return InputError(f"{repo} has no {file or 'such file'} on the Hugging Face Hub")
    if isinstance(error, LocalEntryNotFoundError):  # huggingface_hub's word for "offline"
        if not isinstance(error.__cause__, Exception):
            return cannot_download(repo, _offline_reason())
        error = error.__cause__  # what went wrong online, e.g. an HTTP 500
    return cannot_download(repo, f"{type(error).__name__}: {_first_line(error)}".rstrip(": "))


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def _listing(repo: str, commit: str) -> dict[str, int] | None:
    """The repo's files at `commit` as the cache recorded them, None when it did not."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return {f.path: int(f.size) for f in get_cached_repo_tree(repo, revision=commit)}
    except CachedRepoTreeNotFoundError:
        return None


def fetch_metadata(
    repo: str, progress: DownloadProgress | None = None, online: bool = True
) -> HubSnapshot:
    """The snapshot holding `repo`'s config, tokenizer and index files, downloaded if needed
    (online=False: from the cache only, as `--no-hub` asks)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars
    from huggingface_hub.utils import logging as hf_logging

    disable_progress_bars()  # the rank's stderr carries events only
    hf_logging.set_verbosity_error()
    patterns = list(META_PATTERNS)
    cached: Path | None = None
    try:
        cached = Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except LocalEntryNotFoundError:  # not cached, or the listing shows files missing
        pass
    except ValueError as e:  # not a valid repo id
        raise InputError(f"model {repo!r}: {_first_line(e)}") from None
    if cached is not None and (sizes := _listing(repo, cached.name)) is not None:
        return HubSnapshot(repo, cached, sizes)  # complete, as far as the cached listing says
    # Without a listing, a snapshot may hold only what the launcher read (config.json).
    if not online:
        if cached is not None:
            return HubSnapshot(repo, cached, None)
        raise InputError(
            f"{repo} is not in this host's Hugging Face cache and --no-hub forbids downloading it"
        )
    if not hub_reachable():
        if cached is not None:  # e.g. cached by an older huggingface_hub: use what is there
            return HubSnapshot(repo, cached, None)
        raise cannot_download(repo, _offline_reason())
    if progress is not None:
        progress(DownloadStep(0, 0, "metadata"))
    try:
        path = Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as e:  # any failure to download is one line, never a traceback
        raise _download_error(repo, e) from None
    return HubSnapshot(repo, path, _listing(repo, path.name))


def fetch_files(
    snap: HubSnapshot, files: Sequence[str], progress: DownloadProgress | None = None
) -> None:
    """Download, one by one, those of `files` the snapshot lacks (nothing when it has them)."""
    from huggingface_hub import hf_hub_download

    missing = [f for f in files if not (snap.path / f).is_file()]
    if not missing:
        return
    if not hub_reachable():
        gap = f"{len(missing)} file{'s' * (len(missing) != 1)} not in the cache"
        raise cannot_download(snap.repo, f"{_offline_reason()}; {gap}")
    for i, name in enumerate(missing):
        size = None if snap.sizes is None else snap.sizes.get(name)
        with _Ticker(DownloadStep(i, len(missing), name, 0, size), progress) as ticker:
            try:
                # The snapshot's commit, so weights and metadata always match.
                hf_hub_download(snap.repo, name, revision=snap.path.name, tqdm_class=ticker.bar())
            except Exception as e:  # any failure to download is one line, never a traceback
                raise _download_error(snap.repo, e, name) from None
        if progress is not None:
            got = (snap.path / name).stat().st_size
            progress(DownloadStep(i + 1, len(missing), name, got, size))


class _Ticker:
    """Reports a file's start, then its received bytes every TICK_S while they grow (a stalled
    download goes quiet, so the launcher's load deadline still catches it)."""

    def __init__(self, step: DownloadStep, progress: DownloadProgress | None) -> None:
        self.step, self.progress = step, progress
        self.received = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def bar(self) -> Any:
        """A stand-in for hf_hub_download's tqdm bar (its `tqdm_class`) that counts bytes."""
        from tqdm import tqdm

        ticker = self

        class ByteCount(tqdm):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **{**kwargs, "disable": True})

            def update(self, n: float | None = 1) -> bool | None:
                ticker.received += int(n or 0)  # bytes written to the file
                return None

            def update_transfer(self, n: float | None = 1) -> None:
                pass  # bytes off the wire: `update` counts them once written

        return ByteCount

    def _run(self) -> None:
        reported = 0
        while not self.stop.wait(TICK_S):
            if self.progress is not None and self.received != reported:
                reported = self.received
                self.progress(replace(self.step, bytes=reported))

    def __enter__(self) -> _Ticker:
        if self.progress is not None:
            self.progress(self.step)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
