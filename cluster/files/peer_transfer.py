"""One GET of a model file from one host serving it, appended to the file's `.part`.

The request resumes at the `.part`'s size (a Range header); the answer's status and extent are
checked against the manifest before a byte is kept. Receiving overlaps with hashing and writing,
so a copy runs at the speed of the link. Failures another source or a retry may fix are `Cut`;
the others are InputError (one line). No MLX here.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlsplit

from cluster.files.manifest import FileEntry
from cluster.files.part_file import PartFile
from topology.errors import InputError

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0  # a transfer stalled this long counts as cut
BUFFER = 2 << 20  # one read from the socket; BUFFERS of them let hashing and writing lag
BUFFERS = 3
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")

SizeReport = Callable[[int], None]  # called with the .part's size whenever it changes


class Cut(Exception):
    """One attempt failed in a way another source, or a retry, may fix; str() says why."""

    def __init__(self, why: str, unreachable: bool = False) -> None:
        super().__init__(why)
        self.unreachable = unreachable  # could not even connect


class Stopped(Exception):
    """Another file failed: this one ends early (its .part stays for the next launch)."""


def source_address(source: str) -> tuple[str, int | None, str]:
    """Host, port and path of a base URL `http://host:port[/path]`."""
    try:
        url = urlsplit(source)
        port = url.port
    except ValueError:
        url, port = None, None
    if url is None or url.scheme != "http" or not url.hostname:
        raise InputError(f"cannot fetch model files from {source!r}: not an http://host:port")
    return url.hostname, port, url.path.rstrip("/")


def get_into(
    part: PartFile,
    source: str,
    token: str,
    name: str,
    entry: FileEntry,
    report: SizeReport,
    stop: threading.Event,
) -> None:
    """One GET of `name` from `source`, appended to `part`. Cut when worth retrying; Stopped
    as soon as `stop` is set."""
    host, port, base = source_address(source)
    conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
    try:
        try:
            conn.connect()
        except OSError as e:
            raise Cut(_why(e), unreachable=True) from None
        if conn.sock is not None:
            conn.sock.settimeout(READ_TIMEOUT_S)
        start = part.size
        headers = {"Authorization": f"Bearer {token}"}
        if start:
            headers["Range"] = f"bytes={start}-"
        path = f"{base}/files/{quote(name, safe='')}"
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            _check(response, source, name, entry, part, start, report)
            _stream(response, part, entry.size, report, stop)
        except (OSError, http.client.HTTPException) as e:
            raise Cut(_why(e)) from None
    finally:
        conn.close()


def _check(
    response: http.client.HTTPResponse,
    source: str,
    name: str,
    entry: FileEntry,
    part: PartFile,
    start: int,
    report: SizeReport,
) -> None:
    """The answer's status and extent; `part` starts over when the source sends it all."""
    status = response.status
    if status == 200:
        if start:
            part.truncate()  # the source ignored the range: take the whole file
            report(0)
        size = response.getheader("Content-Length")
    elif status == 206:
        found = _CONTENT_RANGE.fullmatch(response.getheader("Content-Range") or "")
        if not found or int(found[1]) != start:
            raise Cut(f"{source} answered a wrong range for {name}")
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
        raise Cut(f"HTTP {status}{_error_text(response)}")
    if size != str(entry.size):
        raise InputError(
            f"{source} serves {name} with {size or 'an unknown number of'} bytes, the "
            f"model's manifest says {entry.size} (did the model change on the host "
            "serving it?)"
        )


def _stream(
    response: http.client.HTTPResponse,
    part: PartFile,
    size: int,
    report: SizeReport,
    stop: threading.Event,
) -> None:
    """Receive into reused buffers while two helper threads hash and write the previous
    ones: sha256 alone is about as fast as a fast link, so the three must overlap (each
    releases the GIL)."""

    def append(data: memoryview) -> None:
        part.append(data)
        report(part.size)

    buffers = [memoryview(bytearray(BUFFER)) for _ in range(BUFFERS)]
    pending: list[tuple[Future[None], Future[None]] | None] = [None] * BUFFERS
    # One thread each: hashing and writing stay in order.
    with ThreadPoolExecutor(1) as hasher, ThreadPoolExecutor(1) as writer:
        try:
            at, slot = part.size, 0
            while at < size:
                if stop.is_set():
                    raise Stopped
                for done in pending[slot] or ():
                    done.result()  # this buffer is free again; a write error surfaces
                view = buffers[slot][: min(BUFFER, size - at)]
                n = response.readinto(view)
                if not n:
                    raise http.client.IncompleteRead(b"", size - at)
                pending[slot] = (
                    hasher.submit(part.hash.update, view[:n]),
                    writer.submit(append, view[:n]),
                )
                at, slot = at + n, (slot + 1) % BUFFERS
        finally:
            for done in (f for both in pending for f in both or ()):
                done.result()  # the .part holds, hashed, all that was received


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
