"""Offer the model to the ranks on other hosts: build its manifest, serve it, tell each rank.

A rank on another host gets, in its job, the launcher's manifest, a per-launch token and the
base URLs of this host's file servers, fastest first: for each address the hostfile gives the
rank's host (its Thunderbolt links first), the address this host reaches it from, then the
same for its ssh address. Servers are bound to exactly those addresses (launcher/share/
server.py). Ranks on this host read the files directly and get no share.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from cluster.job import RankJob
from cluster.manifest import Manifest, folder_manifest
from launcher.ranks.target import LaunchTarget, rank_host
from launcher.share.server import ModelFileServer
from topology.errors import InputError


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
        manifest, files = folder_manifest(folder)
        return Offer(manifest, files, None)
    from cluster.fetch import fetch_metadata

    try:
        snap = fetch_metadata(model, online=hub)
    except InputError:  # not cached here and no Hub: every rank is on its own
        return None
    manifest, files = folder_manifest(snap.path, name=model.replace("/", "--"))
    return Offer(manifest, files, snap.path.name)


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


class ModelShare:
    """While open, serves the model's files to every rank that runs on another host."""

    def __init__(self, model: str, hub: bool = True) -> None:
        self.model, self.hub = model, hub
        self.token = secrets.token_urlsafe(32)
        self.servers: dict[str, ModelFileServer] = {}  # by local address
        self._offer: Offer | None = None
        self._looked = False

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
        offer = self._load() if remote else None
        if offer is None:
            return out
        for rank in remote:
            sources = self._sources(target, rank)
            out[rank] = replace(out[rank], share=self._share(offer, sources))
        return out

    def _load(self) -> Offer | None:
        if not self._looked:
            self._offer, self._looked = model_offer(self.model, self.hub), True
        return self._offer

    def _share(self, offer: Offer, sources: list[str]) -> dict[str, Any]:
        manifest = offer.manifest.to_json()
        return {"token": self.token, "sources": sources, "manifest": manifest,
                "revision": offer.revision}  # fmt: skip

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
