"""A real HTTP server speaking just enough of the Hugging Face Hub for huggingface_hub 2.4.

What huggingface_hub calls (read from its file_download.py, _snapshot_download.py, hf_api.py):
- GET  /api/models/{repo}/revision/{rev}       repo_info: JSON with "id" and "sha" (the commit)
- GET  /api/models/{repo}/tree/{rev}?recursive  list_repo_tree: JSON list of files (one page: no
                                                 Link header); written to the cache's trees/
- HEAD /{repo}/resolve/{rev}/{file}             metadata: X-Repo-Commit, ETag, Content-Length
- GET  /{repo}/resolve/{rev}/{file}             the bytes
Errors are told apart by the X-Error-Code header: RepoNotFound, GatedRepo, EntryNotFound.
Every request is logged as (method, path) so tests can say what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

PIECE = 4 * 1024 * 1024


@dataclass
class Repo:
    folder: Path
    gated: bool = False
    pause_s: float = 0.0  # after every PIECE bytes of a file: a slow link
    commit: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1()
        for name, data in sorted(self.files().items()):
            digest.update(name.encode() + hashlib.sha1(data).digest())
        self.commit = digest.hexdigest()

    def files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.folder.iterdir()) if p.is_file()}


class FakeHub:
    """`with fake_hub({"org/tiny": Repo(folder)}) as hub:` then HF_ENDPOINT=hub.url."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self.log: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def fetched(self, repo: str) -> list[str]:
        """The files of `repo` whose bytes were sent (GET .../resolve/...), in order."""
        marker = f"/{repo}/resolve/"
        with self.lock:
            paths = [p for m, p in self.log if m == "GET" and p.startswith(marker)]
        return [p[len(marker) :].split("/", 1)[1] for p in paths]

    def requests(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.log)


@contextmanager
def fake_hub(repos: dict[str, Repo]) -> Iterator[FakeHub]:
    hub = FakeHub(repos)
    thread = threading.Thread(target=hub.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.server.shutdown()
        hub.server.server_close()
        thread.join(10)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # the hub's log is `hub.log`

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub.lock:
                hub.log.append((self.command, path))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6:
                self._api(f"{parts[2]}/{parts[3]}", parts[4], body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), body)
            else:
                self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, body)

        def _repo(self, repo_id: str, body: bool) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, body)
            elif repo.gated:
                self._send(403, b"", {"X-Error-Code": "GatedRepo"}, body)
            else:
                return repo
            return None

        def _api(self, repo_id: str, what: str, body: bool) -> None:
            repo = self._repo(repo_id, body)
            if repo is None:
                return
            if what == "revision":
                info = {"id": repo_id, "sha": repo.commit, "private": False}
                return self._json(info, body)
            tree = []
            for name, data in repo.files().items():
                entry = {"type": "file", "path": name, "size": len(data), "oid": _git_oid(data)}
                if name.endswith(".safetensors"):  # weights live in LFS on the real Hub
                    sha = hashlib.sha256(data).hexdigest()
                    entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
                tree.append(entry)
            self._json(tree, body)

        def _resolve(self, repo_id: str, name: str, body: bool) -> None:
            repo = self._repo(repo_id, body)
            if repo is None:
                return
            data = repo.files().get(name)
            commit = {"X-Repo-Commit": repo.commit}
            if data is None:
                return self._send(404, b"", {**commit, "X-Error-Code": "EntryNotFound"}, body)
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            self._send(200, data, {**commit, "ETag": etag}, body, repo.pause_s)

        def _json(self, value: object, body: bool) -> None:
            data = json.dumps(value).encode()
            self._send(200, data, {"Content-Type": "application/json"}, body)

        def _send(
            self, status: int, data: bytes, headers: dict[str, str], body: bool, pause_s: float = 0
        ) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for start in range(0, len(data) if body else 0, PIECE):
                self.wfile.write(data[start : start + PIECE])
                self.wfile.flush()
                time.sleep(pause_s)

    return Handler


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
