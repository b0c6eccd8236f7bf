"""A rank copies model files from a real local HTTP server speaking the launcher's protocol.

The server here is a minimal stand-in for cluster/files/file_server.py (GET /files/<name> with a
bearer token and `Range: bytes=<start>-`) that can throttle, cut, stall or corrupt its answers
and logs every request, so what a fetch transferred is read from its log. Interrupted fetches
run in child processes that are killed for real. Also: cluster/files/digests.py's remembered sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest
from paths import ROOT

from cluster.files import hub_fetch, peer_transfer
from cluster.files.digests import file_sha256, remember_sha256
from cluster.files.hub_fetch import DownloadStep
from cluster.files.manifest import FileEntry
from cluster.files.peer_fetch import FetchReport, fetch_from_peers, verified
from topology.errors import InputError

TOKEN = "s3cret"
MiB = 1 << 20


@dataclass(frozen=True)
class Request:
    name: str
    range: str | None  # the Range header, as sent


@dataclass
class Served:
    """What the server holds and how it misbehaves; `log` holds every GET of a file."""

    files: dict[str, bytes]
    rate: float | None = None  # bytes per second, when throttled
    corrupt: set[str] = field(default_factory=set)  # sent with one byte changed
    stall: dict[str, int] = field(default_factory=dict)  # once: send this many bytes, go quiet
    whole: bool = False  # ignores Range: always 200 and the whole file
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests(self, name: str) -> list[Request]:
        with self.lock:
            return [r for r in self.log if r.name == name]


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def fail(self, status: int, error: str) -> None:
        body = json.dumps({"error": error}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        served = self.server.served
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.fail(401, "bad token")
        name = unquote(self.path.removeprefix("/files/"))
        data = served.files.get(name)
        if not self.path.startswith("/files/") or data is None:
            return self.fail(404, f"no {name}")
        asked = None if served.whole else self.headers.get("Range")
        with served.lock:
            served.log.append(Request(name, self.headers.get("Range")))
            stall = served.stall.pop(name, None)
        if name in served.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        start = int(m[1]) if (m := re.fullmatch(r"bytes=(\d+)-", asked or "")) else 0
        if start >= len(data) > 0:
            return self.fail(416, "range not satisfiable")
        self.send_response(206 if asked else 200)
        self.send_header("Content-Length", str(len(data) - start))
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        with contextlib.suppress(OSError):  # the client went away (killed, or timed out)
            self.send(memoryview(data)[start:], served.rate, stall)

    def send(self, body: memoryview, rate: float | None, stall: int | None) -> None:
        if stall is not None:
            self.wfile.write(body[:stall])
            time.sleep(3)  # longer than the client's read timeout: it gives up first
            self.close_connection = True
            return
        if rate is None:
            self.wfile.write(body)
            return
        step = 32 * 1024
        for at in range(0, len(body), step):
            self.wfile.write(body[at : at + step])
            time.sleep(step / rate)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, served: Served) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.served = served

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Digests go to a fresh cache (child processes inherit it), never the user's."""
    monkeypatch.setenv("MLX_CLUSTER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def model_files() -> dict[str, bytes]:
    return {
        "model-00001-of-00002.safetensors": os.urandom(5 * MiB + 123),
        "model-00002-of-00002.safetensors": os.urandom(3 * MiB),
        "config.json": b'{"model_type": "llama"}',
        "empty.txt": b"",
    }


def manifest(files: dict[str, bytes]) -> dict[str, FileEntry]:
    return {n: FileEntry(len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()}


@pytest.fixture
def served() -> Iterator[Served]:
    yield Served(model_files())


@pytest.fixture
def server(served: Served) -> Iterator[Server]:
    httpd = Server(served)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there


def assert_landed(dest: Path, files: dict[str, bytes]) -> None:
    """Every file in place with its bytes, and nothing else: no .part nor .lock left."""
    assert sorted(p.name for p in dest.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (dest / name).read_bytes() == data


def child_fetch(
    url: str, wanted: dict[str, FileEntry], dest: Path, buffer: int, parallel: int = 4
) -> str:
    """Python code fetching `wanted` into `dest` and printing its FetchReport as JSON."""
    entries = {n: [e.size, e.sha256] for n, e in wanted.items()}
    return (
        "import json, sys\n"
        "from dataclasses import asdict\n"
        "from pathlib import Path\n"
        "from cluster.files import peer_fetch, peer_transfer\n"
        "from cluster.files.manifest import FileEntry\n"
        f"peer_transfer.BUFFER = {buffer}\n"
        f"wanted = {{n: FileEntry(*e) for n, e in {entries!r}.items()}}\n"
        f"report = peer_fetch.fetch_from_peers([{url!r}], {TOKEN!r}, wanted, "
        f"Path({str(dest)!r}), parallel={parallel})\n"
        "print(json.dumps(asdict(report)))\n"
    )


def start_child(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )


def wait_for_bytes(part: Path, child: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 10
    while not (part.exists() and part.stat().st_size > 0):
        assert time.monotonic() < deadline and child.poll() is None, f"no bytes in {part}"
        time.sleep(0.01)


def test_fetches_verifies_and_lands_every_file_then_nothing_twice(
    server: Server, served: Served, tmp_path: Path
) -> None:
    dest = tmp_path / "models" / "tiny-0123"
    wanted = manifest(served.files)
    report = fetch_from_peers([server.url], TOKEN, wanted, dest)
    assert report == FetchReport(len(wanted), sum(e.size for e in wanted.values()), 0)
    assert_landed(dest, served.files)
    assert all(verified(dest / n, e) for n, e in wanted.items())
    # Once each, whole; an empty file is written without asking.
    assert sorted(r.name for r in served.log) == sorted(n for n in wanted if wanted[n].size)
    assert all(r.range is None for r in served.log)
    served.log.clear()
    again = fetch_from_peers([server.url], TOKEN, wanted, dest)
    assert again == FetchReport(0, 0, 0)
    assert served.log == []


def test_a_changed_file_in_dest_is_fetched_again(
    server: Server, served: Served, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    wanted = manifest(served.files)
    fetch_from_peers([server.url], TOKEN, wanted, dest)
    name = "model-00002-of-00002.safetensors"
    target = dest / name
    with open(target, "r+b") as f:
        f.seek(1000)
        f.write(b"\0" * 8)
    # A later edit (a filesystem's clock ticks coarser than mtime_ns): the digest is stale.
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not verified(target, wanted[name])
    served.log.clear()
    report = fetch_from_peers([server.url], TOKEN, wanted, dest)
    assert report == FetchReport(1, wanted[name].size, 0)
    assert served.log == [Request(name, None)]
    assert_landed(dest, served.files)


def test_bytes_corrupted_in_flight_are_refetched_once_then_refused(
    server: Server, served: Served, tmp_path: Path
) -> None:
    name = "model-00002-of-00002.safetensors"
    served.corrupt.add(name)
    dest = tmp_path / "dest"
    with pytest.raises(
        InputError, match=re.escape(f"{name} from {server.url} does not match")
    ) as e:
        fetch_from_peers([server.url], TOKEN, {name: manifest(served.files)[name]}, dest)
    assert "\n" not in str(e.value)
    assert served.requests(name) == [Request(name, None), Request(name, None)]
    assert list(dest.iterdir()) == []  # neither the file nor its .part or lock


def test_a_killed_fetch_resumes_where_its_part_file_ends(
    server: Server, served: Served, tmp_path: Path
) -> None:
    name = "model-00001-of-00002.safetensors"
    wanted = {name: manifest(served.files)[name]}
    dest = tmp_path / "dest"
    part = dest / f"{name}.part"
    served.rate = 4 * MiB  # ~1.3 s for the file: killed long before its end
    child = start_child(child_fetch(server.url, wanted, dest, buffer=256 * 1024))
    wait_for_bytes(part, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    kept = part.stat().st_size
    assert 0 < kept < wanted[name].size
    served.rate = None
    report = fetch_from_peers([server.url], TOKEN, wanted, dest)
    assert report == FetchReport(1, wanted[name].size - kept, kept)
    assert served.requests(name)[-1] == Request(name, f"bytes={kept}-")
    assert_landed(dest, {name: served.files[name]})  # the dead child's lock file is gone too


@pytest.mark.parametrize(
    ("left", "whole", "asked"),
    [
        (b"x" * MiB, False, [f"bytes={MiB}-", None]),  # wrong bytes: caught at the end
        (b"x" * (4 * MiB), False, [None]),  # longer than the file: not a prefix of it
        (None, True, [f"bytes={MiB}-"]),  # a good prefix, but the server sends it all again
    ],
)
def test_a_part_file_that_cannot_be_resumed_is_fetched_whole(
    server: Server,
    served: Served,
    tmp_path: Path,
    left: bytes | None,
    whole: bool,
    asked: list[str | None],
) -> None:
    name = "model-00002-of-00002.safetensors"
    wanted = {name: manifest(served.files)[name]}
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f"{name}.part").write_bytes(served.files[name][:MiB] if left is None else left)
    served.whole = whole
    report = fetch_from_peers([server.url], TOKEN, wanted, dest)
    size = wanted[name].size
    got = size - MiB + size if len(asked) == 2 else size
    assert report == FetchReport(1, got, 0)
    assert [r.range for r in served.requests(name)] == asked
    assert_landed(dest, {name: served.files[name]})


def test_a_stalled_transfer_resumes_on_the_next_source(
    server: Server, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_transfer, "READ_TIMEOUT_S", 0.5)
    monkeypatch.setattr(peer_transfer, "BUFFER", 256 * 1024)
    name = "model-00001-of-00002.safetensors"
    served.stall[name] = MiB + 100  # the last 100 bytes never fill a buffer: lost to the cut
    wanted = {name: manifest(served.files)[name]}
    other = server.url.replace("127.0.0.1", "localhost")
    report = fetch_from_peers([server.url, other], TOKEN, wanted, tmp_path / "dest")
    assert report == FetchReport(1, wanted[name].size, 0)  # resumed within this call
    assert served.requests(name) == [Request(name, None), Request(name, f"bytes={MiB}-")]
    assert_landed(tmp_path / "dest", {name: served.files[name]})


def test_a_dead_source_falls_through_to_the_next(
    server: Server, served: Served, tmp_path: Path
) -> None:
    wanted = manifest(served.files)
    dead = dead_url()
    report = fetch_from_peers([dead, server.url], TOKEN, wanted, tmp_path / "dest", parallel=1)
    assert report.files == len(wanted)
    # One at a time, largest first.
    assert [r.name for r in served.log] == sorted(wanted, key=lambda n: -wanted[n].size)[:3]
    assert_landed(tmp_path / "dest", served.files)


def test_no_reachable_source_is_one_line_naming_the_file_and_sources(tmp_path: Path) -> None:
    sources = [dead_url(), dead_url()]
    wanted = {"config.json": FileEntry(3, "0" * 64)}
    with pytest.raises(InputError) as e:
        fetch_from_peers(sources, TOKEN, wanted, tmp_path / "dest")
    message = str(e.value)
    assert message.startswith(f"cannot fetch config.json from {sources[0]}, {sources[1]} (")
    assert "host serving it is reachable" in message and "\n" not in message


def test_refusals_are_one_line_errors(server: Server, served: Served, tmp_path: Path) -> None:
    wanted = manifest(served.files)
    with pytest.raises(InputError, match=r"refused the token \(the launcher .* gone\?\)$"):
        fetch_from_peers([server.url], "wrong", wanted, tmp_path / "dest")
    missing = {"tokenizer.json": FileEntry(10, "0" * 64)}
    with pytest.raises(
        InputError, match=re.escape(f"{server.url} does not serve tokenizer.json") + "$"
    ):
        fetch_from_peers([server.url], TOKEN, missing, tmp_path / "dest")
    small = {"config.json": FileEntry(999, wanted["config.json"].sha256)}
    with pytest.raises(InputError, match=r"serves config\.json with 23 bytes, the model's"):
        fetch_from_peers([server.url], TOKEN, small, tmp_path / "dest")
    with pytest.raises(InputError, match="not an http://host:port"):
        fetch_from_peers(["ftp://x:1"], TOKEN, wanted, tmp_path / "dest")
    with pytest.raises(InputError, match="not a file name"):
        fetch_from_peers([server.url], TOKEN, {"../x": FileEntry(1, "0" * 64)}, tmp_path)


def test_two_processes_on_one_host_fetch_each_file_once(
    server: Server, served: Served, tmp_path: Path
) -> None:
    served.rate = 16 * MiB  # ~0.5 s in all
    wanted = manifest(served.files)
    dest = tmp_path / "dest"
    first = start_child(child_fetch(server.url, wanted, dest, 256 * 1024, parallel=2))
    # The second starts while the first is receiving the largest file.
    wait_for_bytes(dest / "model-00001-of-00002.safetensors.part", first)
    second = start_child(child_fetch(server.url, wanted, dest, peer_transfer.BUFFER))
    outs = [c.communicate(timeout=30)[0] for c in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0]
    reports = [FetchReport(**json.loads(out)) for out in outs]
    assert sum(r.files for r in reports) == len(wanted)
    assert sorted(r.name for r in served.log) == sorted(n for n in wanted if wanted[n].size)
    assert_landed(dest, served.files)


def test_progress_reports_each_file_start_growth_and_end(
    server: Server, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_fetch, "TICK_S", 0.05)
    served.rate = 16 * MiB
    wanted = manifest(served.files)
    steps: list[DownloadStep] = []
    fetch_from_peers([server.url], TOKEN, wanted, tmp_path / "dest", steps.append, parallel=2)
    total = len(wanted)
    assert all(s.total == total for s in steps)
    assert [s.done for s in steps] == sorted(s.done for s in steps)
    assert steps[-1].done == total
    for name, entry in wanted.items():
        mine = [s for s in steps if s.file == name]
        assert mine[0].bytes == 0 and mine[-1].bytes == entry.size
        assert all(s.size == entry.size for s in mine)
        assert [s.bytes for s in mine] == sorted(s.bytes or 0 for s in mine)
    big = [s for s in steps if s.file == "model-00001-of-00002.safetensors"]
    assert len(big) > 3  # ticks in between


def test_file_sha256_is_remembered_per_version(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "weights.bin"
    old, new = os.urandom(MiB), os.urandom(MiB)
    path.write_bytes(old)
    assert file_sha256(path) == hashlib.sha256(old).hexdigest()
    assert len(list((cache / "digests").iterdir())) == 1
    # Same size and mtime (restored), same inode: the remembered digest, without reading.
    st = path.stat()
    with open(path, "r+b") as f:
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_sha256(path) == hashlib.sha256(old).hexdigest()
    # A modification time that moved: hashed again.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert file_sha256(path) == hashlib.sha256(new).hexdigest()
    # Through a symlink: the same entry (by the resolved path).
    link = tmp_path / "link.bin"
    link.symlink_to(path)
    assert file_sha256(link) == hashlib.sha256(new).hexdigest()
    assert len(list((cache / "digests").iterdir())) == 1


def test_a_corrupt_digest_entry_is_ignored_and_rewritten(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"abc")
    file_sha256(path)
    (entry,) = (cache / "digests").iterdir()
    entry.write_text("{not json")
    assert file_sha256(path) == hashlib.sha256(b"abc").hexdigest()
    assert json.loads(entry.read_text())["sha256"] == hashlib.sha256(b"abc").hexdigest()


def test_remember_sha256_spares_the_next_hash(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"abc")
    remember_sha256(path, "f" * 64)  # what a download computed while writing
    assert file_sha256(path) == "f" * 64
