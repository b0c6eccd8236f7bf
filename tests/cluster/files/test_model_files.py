"""Where a rank's files come from (cluster/files/model_files.py), with real file servers on
loopback: its own copy when it matches the manifest, else the hosts that serve each file, else
the Hub.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hub_cache import write_hub_cache

from cluster.files.digests import remembered
from cluster.files.file_server import ModelFileServer
from cluster.files.inventory import holdings
from cluster.files.manifest import folder_manifest
from cluster.files.model_files import MissingFiles, ModelFiles, PeerShare, reachable_first

REPO = "org/model"
TOKEN = secrets.token_urlsafe(16)


@pytest.fixture(autouse=True)
def _private_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLX_CLUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A model folder's files (their contents are all that matter here)."""
    model = tmp_path / "origin" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text("{}")
    for i in range(3):
        (model / f"model-0000{i}-of-00003.safetensors").write_bytes(bytes([i]) * 50_000)
    return model


@pytest.fixture
def servers() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def serve(stack: ExitStack, files: dict[str, Path]) -> str:
    return stack.enter_context(ModelFileServer(files, TOKEN, ["127.0.0.1"])).urls[0]


def share(folder: Path, sources: list[tuple[str, list[str]]], **more: Any) -> PeerShare:
    manifest, _ = folder_manifest(folder)
    raw = {"token": TOKEN, "manifest": manifest.to_json(), "revision": None,
           "sources": [{"urls": [u], "files": f} for u, f in sources], **more}  # fmt: skip
    return PeerShare.from_job(raw)


def test_a_matching_own_copy_is_used_in_place(folder: Path, servers: ExitStack) -> None:
    files = ModelFiles(str(folder), share(folder, []), hub=False)
    files.metadata()
    files.obtain(["model-00001-of-00003.safetensors"])
    assert files.where["model-00001-of-00003.safetensors"] == folder / (
        "model-00001-of-00003.safetensors"
    )
    assert files.fetched.files == 0


def test_an_own_copy_that_differs_is_fetched_again(
    folder: Path, servers: ExitStack, tmp_path: Path
) -> None:
    _, where = folder_manifest(folder)
    url = serve(servers, where)
    mine = tmp_path / "mine"  # this host's folder at the same path, one weight different
    mine.mkdir()
    for p in folder.iterdir():
        (mine / p.name).write_bytes(p.read_bytes())
    (mine / "model-00002-of-00003.safetensors").write_bytes(b"\0" * 50_000)
    wanted = share(folder, [(url, sorted(where))])
    files = ModelFiles(str(mine), wanted, hub=False)
    files.metadata()
    files.obtain(sorted(n for n in where if n.endswith(".safetensors")))
    fetched = files.where["model-00002-of-00003.safetensors"]
    assert fetched.read_bytes() == (folder / fetched.name).read_bytes()
    assert fetched.parent.parent == tmp_path / "cache" / "models"
    assert files.where["model-00000-of-00003.safetensors"].parent == mine
    assert files.fetched.files == 1


def test_different_files_come_from_different_hosts(
    folder: Path, servers: ExitStack, tmp_path: Path
) -> None:
    _, where = folder_manifest(folder)
    weights = sorted(n for n in where if n.endswith(".safetensors"))
    first = serve(servers, {n: where[n] for n in ["config.json", "tokenizer.json", weights[0]]})
    second = serve(servers, {n: where[n] for n in weights[1:]})
    plan = [(first, ["config.json", "tokenizer.json", weights[0]]), (second, weights[1:])]
    elsewhere = str(tmp_path / "not-here" / "model")  # the launcher's path: absent here
    files = ModelFiles(elsewhere, share(folder, plan), hub=False)
    assert set(files.metadata()) == {"config.json", "tokenizer.json"}
    files.obtain(weights)
    assert all(files.where[n].read_bytes() == where[n].read_bytes() for n in weights)
    assert files.fetched.files == 5


def test_a_file_no_host_serves_is_one_line_under_no_hub(folder: Path, servers: ExitStack) -> None:
    _, where = folder_manifest(folder)
    url = serve(servers, {"config.json": where["config.json"]})
    files = ModelFiles("/nowhere/model", share(folder, [(url, ["config.json"])]), hub=False)
    with pytest.raises(MissingFiles, match=r"no host of the cluster has tokenizer\.json$"):
        files.metadata()  # the manifest lists it; only config.json is served


def test_a_bad_share_is_one_line() -> None:
    with pytest.raises(Exception, match="launcher and rank versions differ"):
        PeerShare.from_job({"token": TOKEN, "manifest": {"name": "../x", "files": {}}})


def test_inventory_reads_blob_names_and_refs_main(folder: Path, tmp_path: Path) -> None:
    weights = {p.name for p in folder.iterdir() if p.name.endswith(".safetensors")}
    write_hub_cache(tmp_path / "hf", REPO, folder, only=weights | {"config.json"})
    revision, manifest, where = holdings(REPO, None)
    assert revision is not None and set(manifest.files) == weights | {"config.json"}
    full, _ = folder_manifest(folder)
    assert all(manifest.files[n] == full.files[n] for n in manifest.files)
    assert all(where[n].parent.name == "blobs" for n in where)
    assert holdings(REPO, "0" * 40)[1].files == {}  # a commit this host lacks: nothing
    with pytest.raises(ValueError):
        holdings("../../etc", None)


def test_a_folder_is_hashed_once_per_version(folder: Path) -> None:
    weight = folder / "model-00000-of-00003.safetensors"
    assert not remembered(weight)
    folder_manifest(folder)
    assert remembered(weight)  # the launcher's next look reads nothing
    weight.write_bytes(b"\1" * 50_001)
    assert not remembered(weight)


def test_urls_this_host_cannot_reach_go_last(servers: ExitStack, folder: Path) -> None:
    _, where = folder_manifest(folder)
    live = serve(servers, where)
    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert reachable_first((dead, live)) == (live, dead)
    assert reachable_first((live, dead)) == (live, dead)
