"""Where each file a rank loads comes from: this host, a peer of the cluster, or the Hub.

Three sources, in this order: the model as this host already holds it (the local folder or the
Hugging Face cache), then the launching host, which serves the model's files to its ranks
(launcher/share/), then the Hub, only for files no host has and only when allowed (`--no-hub`).
With a peer share every file is checked against the launcher's manifest, so all ranks load the
same bytes; files copied from a peer land in cache_root()/models/<name>-<digest>/.
Metadata comes first (config, tokenizer, index), so the caller can work out which weight files
its shard reads before any weight moves. No MLX here.
"""

from __future__ import annotations

import fnmatch
import socket
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cluster.files.cache import cache_root
from cluster.files.file_server import ModelFileServer
from cluster.files.hub_fetch import (
    META_PATTERNS,
    WEIGHTS,
    DownloadProgress,
    HubSnapshot,
    fetch_files,
    fetch_metadata,
)
from cluster.files.inventory import holdings, repo_folder
from cluster.files.manifest import FileEntry, Manifest, is_model_file_name
from cluster.files.peer_fetch import FetchReport, fetch_from_peers, verified
from topology.errors import InputError

PROBE_S = 2.0  # a connect on a cable or lan answers in milliseconds


class MissingFiles(InputError):
    """No source has some of the files: the caller adds which rank and layers wanted them."""


@dataclass(frozen=True)
class FileSource:
    """One host serving model files: its base URLs (fastest first) and the names it has."""

    urls: tuple[str, ...]
    files: frozenset[str]


@dataclass(frozen=True)
class PeerShare:
    """A job's `share` field: who serves which files of the model, and what they are."""

    token: str
    sources: tuple[FileSource, ...]  # the launching host first, then other ranks' hosts
    manifest: Manifest
    revision: str | None  # the Hub commit of a repo id's files; None for a local folder
    serve: Mapping[str, Any] | None  # {"port", "addresses", "files"}: serve them to peers

    @classmethod
    def from_job(cls, raw: Mapping[str, Any]) -> PeerShare:
        try:
            sources = []
            for item in raw.get("sources") or []:
                urls, files = item["urls"], item["files"]
                if not all(isinstance(u, str) for u in urls + files):
                    raise ValueError("sources: expected URLs and file names")
                sources.append(FileSource(tuple(urls), frozenset(files)))
            revision = raw.get("revision")
            if revision is not None and not isinstance(revision, str):
                raise ValueError("revision: expected a commit hash")
            serve = raw.get("serve")
            if serve is not None and not isinstance(serve, dict):
                raise ValueError("serve: expected an object")
            manifest = Manifest.from_json(raw["manifest"])
            return cls(str(raw["token"]), tuple(sources), manifest, revision, serve)
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"bad share in the job ({e}): launcher and rank versions differ"
            ) from None

    def urls_for(self, name: str) -> tuple[str, ...]:
        """Every URL that serves `name`, in the order the launcher gave the hosts."""
        return tuple(u for s in self.sources if name in s.files for u in s.urls)


def is_metadata(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in META_PATTERNS)


class ModelFiles:
    """The files of one model on this host, found or fetched on demand: `metadata()` first,
    then `obtain(weight files)`; `where` maps each file to the path to load it from."""

    def __init__(
        self,
        model: str,
        share: PeerShare | None,
        hub: bool,
        progress: DownloadProgress | None = None,
    ) -> None:
        self.model, self.share, self.hub, self.progress = model, share, hub, progress
        self.where: dict[str, Path] = {}
        self.fetched = FetchReport(0, 0, 0)
        local = Path(model).expanduser()
        self.folder = local if local.is_dir() else None  # this host's own copy, if any
        self.snapshot: HubSnapshot | None = None
        self.is_repo = self.folder is None
        if self.is_repo and (
            local.exists() or model.count("/") != 1 or model.startswith((".", "/", "~"))
        ):
            if share is None:
                raise InputError(
                    f"model {model!r} not found: give a model folder or a Hugging Face id"
                )
            self.is_repo = False  # a folder that only the launching host has

    # -- metadata ---------------------------------------------------------------------------
    def metadata(self) -> dict[str, Path]:
        """config.json, tokenizer and index files: found here, or fetched."""
        if self.share is None:
            self._own_metadata()
        else:
            names = [n for n in self.share.manifest.files if is_metadata(n)]
            if self.is_repo and not names:  # the launcher has nothing of this repo
                self._own_metadata()
            else:
                self.obtain(names)
            if self.is_repo and self.hub and not any(n.startswith("tokenizer") for n in self.where):
                # No host had the tokenizer (the launcher may hold just what planning read).
                snap = fetch_metadata(self.model, self.progress)
                extra = [p for p in snap.path.iterdir() if is_metadata(p.name)]
                self.where.update({p.name: p for p in extra if p.name not in self.where})
        if "config.json" not in self.where:
            shown = self.folder or self.model
            raise InputError(f"{shown} has no config.json: point --model at an MLX model folder")
        return dict(self.where)

    def _own_metadata(self) -> None:
        if self.folder is not None:
            items = [p for p in self.folder.iterdir() if not fnmatch.fnmatch(p.name, WEIGHTS)]
            self.where.update({p.name: p for p in items if not p.name.endswith(".safetensors")})
            return
        self.snapshot = self._hub_snapshot()
        for p in self.snapshot.path.iterdir():
            if not p.name.endswith(".safetensors"):
                self.where[p.name] = p

    def weight_names(self) -> list[str]:
        """Every model*.safetensors file of the model (the index picks a shard's among them)."""
        if self.share is not None and any(
            fnmatch.fnmatch(n, WEIGHTS) for n in self.share.manifest.files
        ):
            return sorted(n for n in self.share.manifest.files if fnmatch.fnmatch(n, WEIGHTS))
        if self.folder is not None:
            return sorted(p.name for p in self.folder.glob(WEIGHTS))
        snap = self._hub_snapshot()
        if snap.sizes is None and not snap.path.is_dir():  # nothing here yet: mlx-lm's default
            return ["model.safetensors"]
        return snap.weight_files()

    # -- files ------------------------------------------------------------------------------
    def obtain(self, names: Iterable[str]) -> None:
        """Make every named file loadable: this host's copy, else a peer's, else the Hub's."""
        peers: dict[str, FileEntry] = {}
        hub: list[str] = []
        for name in names:
            if name in self.where:
                continue
            found = self._here(name)
            if found is not None:
                self.where[name] = found
            elif self.share is not None and self.share.urls_for(name):
                peers[name] = self.share.manifest.files[name]
            else:
                hub.append(name)
        if peers:
            self._from_peers(peers)
        if hub:
            self._from_hub(hub)

    def _here(self, name: str) -> Path | None:
        """This host's own copy of `name`, when it is the launcher's (or, with no launcher's
        list to compare with, when it is this host's copy of the same model)."""
        candidates: list[Path] = []
        if self.folder is not None:
            candidates.append(self.folder / name)
        elif self.is_repo and (snap := self._cached_snapshot()) is not None:
            candidates.append(snap / name)
        if self.share is not None:
            candidates.append(self._copies() / name)
        entry = self.share.manifest.files.get(name) if self.share is not None else None
        for path in candidates:
            if not path.is_file():
                continue
            if entry is None:  # a repo's snapshot is one commit; a folder must match the list
                return path if self.is_repo or self.share is None else None
            if _matches(path, entry):
                return path
        return None

    def _cached_snapshot(self) -> Path | None:
        """The Hub cache's folder of the launcher's commit (else of the one found here)."""
        if self.share is not None and self.share.revision:
            return repo_folder(self.model) / "snapshots" / self.share.revision
        return self.snapshot.path if self.snapshot is not None else None

    def _copies(self) -> Path:
        """This host's copies: a repo's by commit (what the cluster holds of it may grow), a
        folder's by the digest of its files."""
        assert self.share is not None
        manifest, revision = self.share.manifest, self.share.revision
        folder = f"{manifest.name}-{revision[:16]}" if revision else manifest.folder
        return cache_root() / "models" / folder

    def _from_peers(self, wanted: dict[str, FileEntry]) -> None:
        """Fetch from the hosts that have them: files held by the same hosts in one go, so
        different files can come from different peers."""
        assert self.share is not None
        groups: dict[tuple[str, ...], dict[str, FileEntry]] = {}
        for name, entry in wanted.items():
            groups.setdefault(self.share.urls_for(name), {})[name] = entry
        if () in groups:
            self._missing(sorted(groups[()]), "and no host serves it")
        dest = self._copies()
        for urls, files in groups.items():
            ordered = reachable_first(urls)
            report = fetch_from_peers(ordered, self.share.token, files, dest, self.progress)
            self.fetched = FetchReport(
                self.fetched.files + report.files,
                self.fetched.bytes + report.bytes,
                self.fetched.resumed + report.resumed,
            )
            self.where.update({name: dest / name for name in files})

    def _from_hub(self, names: list[str]) -> None:
        if not self.is_repo:
            self._missing(names, "")
            return
        snap = self._hub_snapshot()
        if not self.hub and any(not (snap.path / n).is_file() for n in names):
            self._missing(names, "and --no-hub forbids the Hugging Face Hub")
        fetch_files(snap, names, self.progress)
        self.where.update({name: snap.path / name for name in names})

    def _hub_snapshot(self) -> HubSnapshot:
        if self.snapshot is None:
            path = self._cached_snapshot()
            if path is not None and path.is_dir():  # the launcher's commit, as cached here
                self.snapshot = HubSnapshot(self.model, path, None)
            else:
                self.snapshot = fetch_metadata(self.model, self.progress, online=self.hub)
        return self.snapshot

    def _missing(self, names: list[str], why: str) -> None:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        where = "no host of the cluster has" if self.share is not None else "this host lacks"
        raise MissingFiles(f"{self.model}: {where} {shown}{' ' + why if why else ''}")


def reachable_first(urls: tuple[str, ...]) -> tuple[str, ...]:
    """The URLs this host can connect to first, each group in the launcher's order (fastest
    first): a peer's address on a cable to another host may route nowhere, or to a gateway
    that swallows it, and each such try would cost a connect timeout per file."""
    if len(urls) < 2:
        return urls
    with ThreadPoolExecutor(len(urls)) as pool:
        ok = list(pool.map(_connects, urls))
    return tuple(u for u, k in zip(urls, ok, strict=True) if k) + tuple(
        u for u, k in zip(urls, ok, strict=True) if not k
    )


def _connects(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 80), PROBE_S):
            return True
    except (OSError, ValueError):
        return False


def serve_own_files(model: str, share: PeerShare) -> list[ModelFileServer]:
    """Serve this host's copy of the files the launcher listed to the other ranks (for as long
    as the rank runs), on each of the host's addresses that it can bind; nothing when none."""
    if share.serve is None or share.revision is None:
        return []
    _, _, where = holdings(model, share.revision)
    listed = set(share.serve.get("files") or [])
    files = {
        name: path
        for name, path in where.items()
        if name in listed and name in share.manifest.files
        and _matches(path, share.manifest.files[name])
    }  # fmt: skip
    servers = []
    port = int(share.serve.get("port") or 0)
    for address in _own_addresses(share.serve.get("addresses") or []):
        server = ModelFileServer(files, share.token, [address], port)
        try:
            servers.append(server.__enter__())
        except InputError:  # not this host's address, or the port is taken: peers try others
            continue
    return servers


def _own_addresses(addresses: Iterable[str]) -> list[str]:
    """IP literals as given, host names resolved here (a host may know itself by name)."""
    out: list[str] = []
    for address in addresses:
        try:
            infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue
        out += [str(info[4][0]) for info in infos]
    return list(dict.fromkeys(out))


def _matches(path: Path, entry: FileEntry) -> bool:
    """Is `path` the manifest's file? A Hugging Face blob is named by its sha256 (checked by
    the Hub when it arrived); any other file is hashed, once per version (digests.py)."""
    real = path.resolve()
    if real.parent.name == "blobs" and len(real.name) == 64:
        return real.name == entry.sha256 and real.stat().st_size == entry.size
    return verified(real, entry)


__all__ = [
    "FileSource",
    "MissingFiles",
    "ModelFiles",
    "PeerShare",
    "is_metadata",
    "is_model_file_name",
    "serve_own_files",
]
