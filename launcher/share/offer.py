"""Offer the model to the ranks on other hosts: build its manifest, serve it, tell each rank.

A rank on another host gets, in its job, the model's manifest, a per-launch token and who
serves which files: first this host's file servers, at the addresses this host reaches the
rank's host from (the hostfile's, i.e. its Thunderbolt links, first; then its ssh address),
bound to exactly those (cluster/files/file_server.py); then, for a repo this host lacks files of,
the other ranks whose hosts' Hub caches hold them (launcher/share/holdings.py), each serving
them on share_port. Ranks on this host read the files directly and get no share.
"""

from __future__ import annotations

import secrets
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from cluster.files.digests import remembered
from cluster.files.file_server import ModelFileServer
from cluster.files.manifest import FileEntry, Manifest, folder_manifest
from cluster.job import RankJob
from launcher.ranks.jobs import DEFAULT_PORT
from launcher.ranks.target import LaunchTarget, rank_host
from launcher.share.holdings import host_holdings
from topology.errors import InputError
from topology.untrusted import load_json

HASH_NOTICE_BYTES = 1 << 30
SHARE_PORT_OFFSET = 400  # ring ports count up from --port one per address, heartbeats after


@dataclass(frozen=True)
class Offer:
    manifest: Manifest
    files: dict[str, Path]  # name -> the file on this host
    revision: str | None  # the Hub commit of a repo id's snapshot


def model_offer(model: str, hub: bool) -> Offer | None:
    """The model as this host holds it: a local folder, or a repo's snapshot in the Hugging
    Face cache (its metadata completed from the Hub when allowed); None when it has nothing."""
    folder = Path(model)
    if folder.is_dir():
        _say_hashing(folder)
        manifest, files = folder_manifest(folder)
        return Offer(manifest, files, None)
    from cluster.files.hub_fetch import fetch_metadata

    try:
        snap = fetch_metadata(model, online=hub)
    except InputError:  # not cached here and no Hub: every rank is on its own
        return None
    manifest, files = folder_manifest(snap.path, name=model.replace("/", "--"))
    return Offer(manifest, files, snap.path.name)


def _say_hashing(folder: Path) -> None:
    """A folder hashed for the first time can take minutes (~1-2 GB/s): say so first."""
    new = [p for p in folder.iterdir() if p.is_file() and not remembered(p)]
    size = sum(p.stat().st_size for p in new)
    if size >= HASH_NOTICE_BYTES:
        sys.stderr.write(
            f"mlx-cluster: hashing {size / 1e9:.1f} GB of {folder} once, so every host loads "
            "the same bytes\n"
        )
        sys.stderr.flush()


def _url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def route_source(address: str) -> str | None:
    """This host's address on the route to `address` (a UDP connect sends nothing)."""
    try:
        infos = socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _name, peer in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(peer)
                return str(s.getsockname()[0])
        except OSError:
            continue
    return None


def host_addresses(target: LaunchTarget, rank: int) -> list[str]:
    """Where a rank's host can be reached: the hostfile's addresses (its collectives' links,
    the fastest), then the cluster file's, then its ssh destination."""
    hosts = target.hostfile.get("hosts") or []
    entry = hosts[rank] if rank < len(hosts) and isinstance(hosts[rank], dict) else {}
    out = [str(ip) for ip in entry.get("ips") or []]
    spec = rank_host(target, rank)
    if spec is not None:
        out += [*spec.ips, spec.ssh.rpartition("@")[2]]
    return list(dict.fromkeys(out))


def _complete(offer: Offer) -> bool:
    """Does this host hold every weight file its index names, and a tokenizer?"""
    index = offer.files.get("model.safetensors.index.json")
    try:
        raw = load_json(index.read_bytes(), str(index), max_bytes=64 << 20) if index else None
    except (OSError, InputError):
        return False
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    weights = set(weight_map.values()) if isinstance(weight_map, dict) else {"model.safetensors"}
    tokenizer = any(name.startswith("tokenizer") for name in offer.files)
    return tokenizer and all(str(w) in offer.files for w in weights)


def share_port(target: LaunchTarget, rank: int) -> int:
    """Where a rank serves its host's files to its peers: above the ring and heartbeat ports."""
    return (target.port or DEFAULT_PORT) + SHARE_PORT_OFFSET + rank


class ModelShare:
    """While open, serves the model's files to every rank that runs on another host, and has
    the ranks whose hosts hold files this host lacks serve them to their peers."""

    def __init__(self, model: str, hub: bool = True) -> None:
        self.model, self.hub = model, hub
        self.token = secrets.token_urlsafe(32)
        self.servers: dict[str, ModelFileServer] = {}  # by local address
        self._offer: Offer | None = None
        self._looked = False
        self._held: dict[str, dict[str, FileEntry]] | None = None  # by host name
        self._revision: str | None = None

    def __enter__(self) -> ModelShare:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        for server in self.servers.values():
            server.__exit__(None, None, None)
        self.servers.clear()

    def jobs(self, target: LaunchTarget, jobs: list[RankJob]) -> list[RankJob]:
        """The jobs with `hub` set, and `share` for each rank on another host."""
        out = [replace(job, hub=self.hub) for job in jobs]
        remote = [job.rank for job in jobs if rank_host(target, job.rank) is not None]
        if not remote:
            return out
        offer = self._load()
        held = self._holdings(target, remote, offer)
        files = dict(offer.manifest.files) if offer is not None else {}
        for got in held.values():
            files.update({n: e for n, e in got.items() if n not in files})
        if not files:
            return out
        name = offer.manifest.name if offer is not None else self.model.replace("/", "--")
        manifest = Manifest(name, files).to_json()
        hosts = {r: target.plan.ranks[r].host for r in remote}
        for rank in remote:
            sources = []
            if offer is not None:
                urls = self._sources(target, rank)
                sources.append({"urls": urls, "files": sorted(offer.manifest.files)})
            for peer in remote:
                if peer != rank and held.get(hosts[peer]):
                    port = share_port(target, peer)
                    urls = [_url(a, port) for a in host_addresses(target, peer)]
                    sources.append({"urls": urls, "files": sorted(held[hosts[peer]])})
            share: dict[str, Any] = {"token": self.token, "sources": sources,
                                     "manifest": manifest, "revision": self._revision}  # fmt: skip
            own = sorted(held.get(hosts[rank]) or [])
            if own:  # files this rank's host has and others lack: it serves them
                port, addresses = share_port(target, rank), host_addresses(target, rank)
                share["serve"] = {"port": port, "files": own, "addresses": addresses}
            out[rank] = replace(out[rank], share=share)
        return out

    def _load(self) -> Offer | None:
        if not self._looked:
            self._offer, self._looked = model_offer(self.model, self.hub), True
            self._revision = self._offer.revision if self._offer is not None else None
        return self._offer

    def _holdings(
        self, target: LaunchTarget, remote: list[int], offer: Offer | None
    ) -> dict[str, dict[str, FileEntry]]:
        """What the other hosts hold, asked once, and only of a repo this host lacks files of."""
        if self._held is not None:
            return self._held
        self._held = {}
        if Path(self.model).is_dir() or (offer is not None and _complete(offer)):
            return self._held
        specs = [s for r in remote if (s := rank_host(target, r)) is not None]
        if target.cluster is None or not specs:
            return self._held
        answers = host_holdings(target.cluster, specs, self.model, self._revision)
        if self._revision is None:  # this host has nothing: the commit most hosts hold
            found = [rev for rev, got in answers.values() if rev is not None and got]
            self._revision = max(set(found), key=found.count) if found else None
        self._held = {
            host: got for host, (rev, got) in answers.items() if rev == self._revision and got
        }
        return self._held

    def _sources(self, target: LaunchTarget, rank: int) -> list[str]:
        local = [route_source(a) for a in host_addresses(target, rank)]
        return [self._serve(a) for a in dict.fromkeys(a for a in local if a is not None)]

    def _serve(self, address: str) -> str:
        """The base URL of this host's server on `address`, started on first use."""
        if address not in self.servers:
            assert self._offer is not None
            server = ModelFileServer(self._offer.files, self.token, [address])
            self.servers[address] = server.__enter__()
        return self.servers[address].url(address)
