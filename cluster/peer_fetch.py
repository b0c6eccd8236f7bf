"""A rank copies the model files its shard needs from the hosts that serve them, over HTTP.

The launching host (and any host holding files it lacks) serves the model to the ranks
(cluster/file_server.py); a rank fetches only the files it reads, into
cache_root()/models/<folder>/.
Every file is checked against the manifest's sha256 before it is used, a cut transfer resumes
from what its `.part` file holds (on the next source, or at the next launch), and a per-file
lock makes two ranks on one host fetch each file once. Receiving overlaps with hashing and
writing, so a copy runs at the speed of the link. No MLX here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import io
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from cluster import fetch as hub_fetch
from cluster.digests import file_sha256, remember_sha256
from cluster.fetch import DownloadProgress, DownloadStep
from cluster.manifest import FileEntry, is_model_file_name
from topology.errors import InputError

if TYPE_CHECKING:
    from _hashlib import HASH

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0  # a transfer stalled this long counts as cut
PASSES = 2  # per file, attempts that add nothing may go this many times over the sources
BUFFER = 2 << 20  # one read from the socket; BUFFERS of them let hashing and writing lag
BUFFERS = 3
HASH_CHUNK = 8 << 20  # reading back a partial download's prefix
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


@dataclass(frozen=True)
class FetchReport:
    files: int  # files received over the network (0: everything was already here)
    bytes: int  # bytes received over the network
    resumed: int  # bytes of earlier partial downloads that were kept (not fetched again)


def verified(path: Path, entry: FileEntry) -> bool:
    """`path` holds exactly the manifest's bytes (its digest is remembered: cluster/digests)."""
    try:
        return path.stat().st_size == entry.size and file_sha256(path) == entry.sha256
    except OSError:
        return False


def fetch_from_peers(
    sources: Sequence[str],
    token: str,
    wanted: Mapping[str, FileEntry],
    dest: Path,
    progress: DownloadProgress | None = None,
    parallel: int = 4,
) -> FetchReport:
    """Fill `dest` with the `wanted` files, fetching those it lacks from `sources` (base URLs,
    fastest first), `parallel` at a time, largest first. InputError (one line) when a file
    cannot be had: unreachable sources, a refused token, a missing or corrupt file."""
    for name in wanted:
        if not is_model_file_name(name):
            raise InputError(f"cannot fetch {name!r}: not a file name in a model folder")
    todo = sorted(
        (n for n, e in wanted.items() if not verified(dest / n, e)),
        key=lambda n: (-wanted[n].size, n),
    )
    if not todo:
        return FetchReport(0, 0, 0)
    if not sources:
        raise InputError("cannot fetch model files: no address of a host serving them is known")
    for source in sources:
        _address(source)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create {dest}: {e.strerror or e}") from None
    run = _Fetch(
        tuple(sources),
        token,
        dest,
        _Progress(progress, len(todo), sum(wanted[n].size for n in todo)),
    )
    with run.progress.ticking(), ThreadPoolExecutor(max(1, min(parallel, len(todo)))) as pool:
        futures = [pool.submit(run.file, name, wanted[name]) for name in todo]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:  # on a failure (or ^C), the others stop at their next read, keeping .part
            failed = [f for f in futures if f.done() and not f.cancelled() and f.exception()]
            if failed or not all(f.done() for f in futures):
                run.stop.set()
                for f in futures:
                    f.cancel()
    errors = [x for f in failed if (x := f.exception()) is not None]
    if errors:  # the first that is not a consequence of another
        raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0]) from None
    reports = [f.result() for f in futures]
    return FetchReport(
        sum(r.files for r in reports),
        sum(r.bytes for r in reports),
        sum(r.resumed for r in reports),
    )


class _Cut(Exception):
    """One attempt failed in a way another source, or a retry, may fix; str() says why."""

    def __init__(self, why: str, unreachable: bool = False) -> None:
        super().__init__(why)
        self.unreachable = unreachable  # could not even connect


class _Stopped(Exception):
    """Another file failed: this one ends early (its .part stays for the next launch)."""


class _Progress:
    """DownloadSteps from several threads, in order: a file's start, its bytes every TICK_S
    while they grow (one ticker thread for all files), its end."""

    def __init__(self, progress: DownloadProgress | None, total: int, expected: int) -> None:
        self.progress, self.total, self.expected = progress, total, expected
        self.done = 0
        self.finished = 0  # bytes of the files done
        self.lock = threading.Lock()  # held while calling `progress`: one step at a time
        self.live: dict[str, list[int]] = {}  # name -> [bytes, size, bytes last reported]
        self.stop = threading.Event()

    def _emit(self, name: str, got: int, size: int) -> None:
        if self.progress is not None:
            received = self.finished + sum(state[0] for state in self.live.values())
            step = DownloadStep(self.done, self.total, name, got, size, received, self.expected)
            self.progress(step)

    def start(self, name: str, got: int, size: int) -> None:
        with self.lock:
            self.live[name] = [got, size, got]
            self._emit(name, got, size)

    def set(self, name: str, got: int) -> None:
        self.live[name][0] = got  # only the file's own threads write its count

    def end(self, name: str, size: int) -> None:
        with self.lock:
            self.live.pop(name, None)
            self.done += 1
            self.finished += size
            self._emit(name, size, size)

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        thread = threading.Thread(target=self._tick, daemon=True)
        if self.progress is not None:
            thread.start()
        try:
            yield
        finally:
            self.stop.set()
            if thread.is_alive():
                thread.join()

    def _tick(self) -> None:
        while not self.stop.wait(hub_fetch.TICK_S):
            with self.lock:
                for name, state in self.live.items():
                    if state[0] != state[2]:
                        state[2] = state[0]
                        self._emit(name, state[0], state[1])


@dataclass
class _Part:
    """A `.part` file being filled: `hash` covers exactly its first `size` bytes."""

    path: Path
    file: io.FileIO
    hash: HASH
    size: int
    kept: int  # of those bytes, how many an earlier download left
    received: int = 0  # over the network, into this file
    broken: bool = False  # a write failed: later ones would leave a hole

    def append(self, data: memoryview) -> None:
        """Write `data` at the end (its hash is the caller's: in another thread)."""
        if self.broken:
            return  # the download ends with the first failure's InputError
        try:
            while data:
                n = self.file.write(data) or 0
                data, self.size, self.received = data[n:], self.size + n, self.received + n
        except OSError as e:
            self.broken = True
            raise InputError(f"cannot write {self.path}: {e.strerror or e}") from None

    def truncate(self) -> None:
        try:
            self.file.seek(0)
            self.file.truncate(0)
        except OSError as e:
            raise InputError(f"cannot write {self.path}: {e.strerror or e}") from None
        self.hash, self.size, self.kept = hashlib.sha256(), 0, 0


class _Fetch:
    """One fetch_from_peers call: what its file threads share."""

    def __init__(
        self, sources: tuple[str, ...], token: str, dest: Path, progress: _Progress
    ) -> None:
        self.sources, self.token, self.dest, self.progress = sources, token, dest, progress
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.unreachable: set[str] = set()  # tried last by the files that start later

    def file(self, name: str, entry: FileEntry) -> FetchReport:
        """Fetch one file unless it is there (maybe fetched meanwhile by another rank)."""
        final = self.dest / name
        with _locked(self.dest / f"{name}.lock"):
            if verified(final, entry):
                with contextlib.suppress(OSError):
                    (self.dest / f"{name}.part").unlink(missing_ok=True)
                report = FetchReport(0, 0, 0)
            else:
                report = self._download(name, entry, final)
        self.progress.end(name, entry.size)
        return report

    def _download(self, name: str, entry: FileEntry, final: Path) -> FetchReport:
        path = self.dest / f"{name}.part"
        try:
            file = io.FileIO(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
        except OSError as e:
            raise InputError(f"cannot write {path}: {e.strerror or e}") from None
        with file:
            part = _open_part(
                path, file, entry.size, lambda got: self.progress.start(name, got, entry.size)
            )
            mismatched = False
            while True:
                source = self._fill(name, entry, part) if part.size < entry.size else "the .part"
                if part.hash.hexdigest() == entry.sha256:
                    break
                # Bytes that do not match the manifest: start over once, then give up.
                if mismatched:
                    with contextlib.suppress(OSError):
                        path.unlink()
                    raise InputError(
                        f"{name} from {source} does not match the model's manifest, twice "
                        "(its sha256 differs): the file changed on the host serving it, or the "
                        "network corrupts data"
                    )
                mismatched = True
                part.truncate()
                self.progress.set(name, 0)
            try:
                os.fsync(file.fileno())
                os.replace(path, final)
            except OSError as e:
                raise InputError(f"cannot write {final}: {e.strerror or e}") from None
        remember_sha256(final, entry.sha256)
        return FetchReport(1, part.received, part.kept)

    def _order(self) -> list[str]:
        with self.lock:
            return sorted(self.sources, key=lambda s: s in self.unreachable)  # stable

    def _fill(self, name: str, entry: FileEntry, part: _Part) -> str:
        """Fill `part` to the file's size, from the sources in turn; the last source used."""
        order = self._order()
        budget = PASSES * len(order)  # attempts that add nothing new to the .part
        best, i, why = part.size, 0, ""
        tried: list[str] = []
        while True:
            source = order[i % len(order)]
            i += 1
            if source not in tried:
                tried.append(source)
            try:
                self._attempt(source, name, entry, part)
                return source
            except _Cut as cut:
                why = str(cut)
                if cut.unreachable:
                    with self.lock:
                        self.unreachable.add(source)
            if part.size > best:
                best = part.size  # progress: the cut costs no attempt
            elif (budget := budget - 1) <= 0:
                raise InputError(
                    f"cannot fetch {name} from {', '.join(tried)} ({why}): check that the "
                    "host serving it is reachable from this host"
                )

    def _attempt(self, source: str, name: str, entry: FileEntry, part: _Part) -> None:
        """One GET of `name` from `source`, appended to `part`. _Cut when worth retrying."""
        host, port, base = _address(source)
        conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
        try:
            try:
                conn.connect()
            except OSError as e:
                raise _Cut(_why(e), unreachable=True) from None
            if conn.sock is not None:
                conn.sock.settimeout(READ_TIMEOUT_S)
            start = part.size
            headers = {"Authorization": f"Bearer {self.token}"}
            if start:
                headers["Range"] = f"bytes={start}-"
            path = f"{base}/files/{quote(name, safe='')}"
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                self._check(response, source, name, entry, part, start)
                self._stream(response, name, part, entry.size)
            except (OSError, http.client.HTTPException) as e:
                raise _Cut(_why(e)) from None
        finally:
            conn.close()

    def _check(
        self,
        response: http.client.HTTPResponse,
        source: str,
        name: str,
        entry: FileEntry,
        part: _Part,
        start: int,
    ) -> None:
        """The answer's status and extent; `part` starts over when the source sends it all."""
        status = response.status
        if status == 200:
            if start:
                part.truncate()  # the source ignored the range: take the whole file
                self.progress.set(name, 0)
            size = response.getheader("Content-Length")
        elif status == 206:
            found = _CONTENT_RANGE.fullmatch(response.getheader("Content-Range") or "")
            if not found or int(found[1]) != start:
                raise _Cut(f"{source} answered a wrong range for {name}")
            size = found[3]
        elif status == 401:
            raise InputError(
                f"{source} refused the token (the launcher that started this rank is gone?)"
            )
        elif status == 404:
            raise InputError(f"{source} does not serve {name}")
        elif status == 416:
            raise InputError(
                f"{source} holds fewer than the {entry.size} bytes of {name} the model's "
                "manifest says (did the model change on the host serving it?)"
            )
        else:
            raise _Cut(f"HTTP {status}{_error_text(response)}")
        if size != str(entry.size):
            raise InputError(
                f"{source} serves {name} with {size or 'an unknown number of'} bytes, the "
                f"model's manifest says {entry.size} (did the model change on the host "
                "serving it?)"
            )

    def _stream(
        self, response: http.client.HTTPResponse, name: str, part: _Part, size: int
    ) -> None:
        """Receive into reused buffers while two helper threads hash and write the previous
        ones: sha256 alone is about as fast as a fast link, so the three must overlap (each
        releases the GIL)."""
        buffers = [memoryview(bytearray(BUFFER)) for _ in range(BUFFERS)]
        pending: list[tuple[Future[None], Future[None]] | None] = [None] * BUFFERS
        # One thread each: hashing and writing stay in order.
        with ThreadPoolExecutor(1) as hasher, ThreadPoolExecutor(1) as writer:
            try:
                at, slot = part.size, 0
                while at < size:
                    if self.stop.is_set():
                        raise _Stopped
                    for done in pending[slot] or ():
                        done.result()  # this buffer is free again; a write error surfaces
                    view = buffers[slot][: min(BUFFER, size - at)]
                    n = response.readinto(view)
                    if not n:
                        raise http.client.IncompleteRead(b"", size - at)
                    pending[slot] = (
                        hasher.submit(part.hash.update, view[:n]),
                        writer.submit(self._append, name, part, view[:n]),
                    )
                    at, slot = at + n, (slot + 1) % BUFFERS
            finally:
                for done in (f for both in pending for f in both or ()):
                    done.result()  # the .part holds, hashed, all that was received

    def _append(self, name: str, part: _Part, data: memoryview) -> None:
        part.append(data)
        self.progress.set(name, part.size)


def _open_part(path: Path, file: io.FileIO, size: int, started: Callable[[int], None]) -> _Part:
    """The .part to resume: its prefix read back and hashed (emptied when longer than the
    file: it cannot be a prefix of it)."""
    h = hashlib.sha256()
    try:
        have = os.fstat(file.fileno()).st_size
        if have > size:
            file.truncate(0)
            have = 0
        started(have)
        buf = memoryview(bytearray(min(HASH_CHUNK, max(have, 1))))
        at = 0
        while at < have and (n := file.readinto(buf[: min(len(buf), have - at)]) or 0):
            h.update(buf[:n])
            at += n
        file.seek(at)
        file.truncate(at)  # what was hashed is what is kept
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    return _Part(path, file, h, at, at)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`, which is removed on release. A waiter that wakes up on a
    lock file already removed locks afresh, so two holders never overlap."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise InputError(f"cannot create {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass  # removed by the holder this one waited for
        except OSError as e:
            os.close(fd)
            raise InputError(f"cannot lock {path}: {e.strerror or e}") from None
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still holding the lock: see above
        os.close(fd)


def _address(source: str) -> tuple[str, int | None, str]:
    """Host, port and path of a base URL `http://host:port[/path]`."""
    try:
        url = urlsplit(source)
        port = url.port
    except ValueError:
        url, port = None, None
    if url is None or url.scheme != "http" or not url.hostname:
        raise InputError(f"cannot fetch model files from {source!r}: not an http://host:port")
    return url.hostname, port, url.path.rstrip("/")


def _why(error: Exception) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, http.client.IncompleteRead):
        return "connection cut"
    text = getattr(error, "strerror", None) or str(error)
    return f"{type(error).__name__}: {text}".rstrip(": ")


def _error_text(response: http.client.HTTPResponse) -> str:
    """': <message>' from an error body {"error": ...}, or nothing."""
    try:
        message: Any = json.loads(response.read(4096)).get("error")
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""
