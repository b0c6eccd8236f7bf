"""A rank copies the model files its shard needs from the hosts that serve them, over HTTP.

The launching host (and any host holding files it lacks) serves the model to the ranks
(file_server.py); a rank fetches only the files it reads, into cache_root()/models/<folder>/.
Every file is checked against the manifest's sha256 before it is used, a cut transfer resumes
from what its `.part` file holds (on the next source, or at the next launch), and a per-file
lock makes two ranks on one host fetch each file once (part_file.py). One GET is
peer_transfer.py; the launcher's progress steps, peer_progress.py. No MLX here.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from cluster.files.digests import file_sha256, remember_sha256
from cluster.files.hub_fetch import DownloadProgress
from cluster.files.manifest import FileEntry, is_model_file_name
from cluster.files.part_file import PartFile, locked, open_part
from cluster.files.peer_progress import FetchProgress
from cluster.files.peer_transfer import Cut, Stopped, get_into, source_address
from topology.errors import InputError

PASSES = 2  # per file, attempts that add nothing may go this many times over the sources


@dataclass(frozen=True)
class FetchReport:
    files: int  # files received over the network (0: everything was already here)
    bytes: int  # bytes received over the network
    resumed: int  # bytes of earlier partial downloads that were kept (not fetched again)


def verified(path: Path, entry: FileEntry) -> bool:
    """`path` holds exactly the manifest's bytes (its digest is remembered: digests.py)."""
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
        source_address(source)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create {dest}: {e.strerror or e}") from None
    run = _Fetch(
        tuple(sources),
        token,
        dest,
        FetchProgress(progress, len(todo), sum(wanted[n].size for n in todo)),
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
        raise next((e for e in errors if not isinstance(e, Stopped)), errors[0]) from None
    reports = [f.result() for f in futures]
    return FetchReport(
        sum(r.files for r in reports),
        sum(r.bytes for r in reports),
        sum(r.resumed for r in reports),
    )


class _Fetch:
    """One fetch_from_peers call: what its file threads share."""

    def __init__(
        self, sources: tuple[str, ...], token: str, dest: Path, progress: FetchProgress
    ) -> None:
        self.sources, self.token, self.dest, self.progress = sources, token, dest, progress
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.unreachable: set[str] = set()  # tried last by the files that start later

    def file(self, name: str, entry: FileEntry) -> FetchReport:
        """Fetch one file unless it is there (maybe fetched meanwhile by another rank)."""
        final = self.dest / name
        with locked(self.dest / f"{name}.lock"):
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
            part = open_part(
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

    def _fill(self, name: str, entry: FileEntry, part: PartFile) -> str:
        """Fill `part` to the file's size, from the sources in turn; the last source used."""
        order = self._order()
        budget = PASSES * len(order)  # attempts that add nothing new to the .part
        best, i, why = part.size, 0, ""
        tried: list[str] = []
        report = functools.partial(self.progress.set, name)
        while True:
            source = order[i % len(order)]
            i += 1
            if source not in tried:
                tried.append(source)
            try:
                get_into(part, source, self.token, name, entry, report, self.stop)
                return source
            except Cut as cut:
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
