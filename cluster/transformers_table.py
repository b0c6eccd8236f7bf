"""transformers' lazy-import table, kept on disk so a process does not build it again.

Every rank imports transformers (mlx-lm's tokenizer code needs it), and `import transformers`
reads the source of each of its ~400 model folders for their `__all__` to build the table its
lazy modules export from: about half a second of CPU, half of what importing mlx-lm costs,
spent again by every rank, every `serve` and every re-planned rank set. `install()` wraps the
function that builds it (`define_import_structure` in transformers.utils.import_utils, as soon
as that module has run) so that the table is read from a JSON file, written by the first
process to build it, keyed by the folder, transformers' version and the folder's mtime.

Anything unexpected leaves transformers to itself: another layout of transformers (the function
missing), a table that does not round-trip through JSON, a cache that cannot be read or written.
No MLX and nothing outside the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

MODULE = "transformers.utils.import_utils"
FUNCTION = "define_import_structure"
FORMAT = 1  # bumped when the file's layout changes

Table = dict[frozenset[str], dict[str, set[str]]]


def cache_dir() -> Path:
    """One per user and Python environment's transformers, whatever MLX_CLUSTER_CACHE says: the
    table follows the installed package, not the cluster's model store."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlx-cluster" / "transformers-imports"


def install(where: Path | None = None) -> None:
    """Serve the table from `where` (default: cache_dir()) in this process. Call it before
    anything imports transformers; once transformers is imported it changes nothing."""
    if MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder(where or cache_dir()))


class _Finder:  # a meta path finder (importlib.abc's base class costs a few ms to import)
    """Finds nothing itself: once, it lets the usual finders find MODULE, then has its loader
    wrap FUNCTION right after the module's code has run."""

    def __init__(self, where: Path) -> None:
        self.where = where

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if spec is None or not isinstance(loader, importlib.machinery.SourceFileLoader):
            return spec
        run = loader.exec_module
        where = self.where

        def exec_module(module: ModuleType) -> None:
            run(module)
            build = getattr(module, FUNCTION, None)
            if callable(build):
                setattr(module, FUNCTION, cached(build, where))

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def cached(build: Callable[..., Any], where: Path) -> Callable[..., Any]:
    """`build` (module_path, prefix=None) -> Table, read from and written to `where`."""
    made: dict[tuple[str, str | None], Any] = {}  # as build's own lru_cache: once a process

    def table(module_path: Any, prefix: str | None = None) -> Any:
        key = (str(module_path), prefix)
        if key not in made:
            made[key] = load_or_build(build, module_path, prefix, where)
        return made[key]

    table.__wrapped__ = build  # type: ignore[attr-defined]
    table.made = made  # type: ignore[attr-defined]  # what this process asked for (a test reads it)
    return table


def load_or_build(
    build: Callable[..., Any], module_path: Any, prefix: str | None, where: Path
) -> Any:
    import hashlib

    stamp = _stamp(str(module_path), prefix)
    if stamp is None:
        return build(module_path, prefix=prefix)
    file = where / (hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32] + ".json")
    # a damaged file, whatever its shape, is built again (AttributeError: rows not as written)
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
        raw = json.loads(file.read_text())
        if raw["stamp"] == stamp:
            return _table(raw["table"])
    table = build(module_path, prefix=prefix)
    with contextlib.suppress(OSError, ValueError, TypeError):
        _write(file, {"stamp": stamp, "table": _rows(table)})
    return table


def _stamp(path: str, prefix: str | None) -> list[Any] | None:
    """What the table depends on: the folder (its mtime changes when a file is added or
    removed), transformers' version (an upgrade in place) and this file's format."""
    # transformers/__init__ sets __version__ before it builds the table; no version, no cache
    version = getattr(sys.modules.get("transformers"), "__version__", None)
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None
    if not isinstance(version, str):
        return None
    return [FORMAT, version, path, prefix, mtime]


def _rows(table: Table) -> list[list[Any]]:
    """Table -> JSON rows; TypeError for anything but the shape known (then it is not kept)."""
    if not isinstance(table, dict):
        raise TypeError("not a table")
    rows = []
    for backends, modules in table.items():
        if not isinstance(backends, frozenset) or not isinstance(modules, dict):
            raise TypeError("not a table")
        names = {m: sorted(_strings(n)) for m, n in modules.items() if isinstance(m, str)}
        if len(names) != len(modules):
            raise TypeError("not a table")
        rows.append([sorted(_strings(backends)), names])
    return rows


def _strings(values: Any) -> set[str]:
    if not isinstance(values, set | frozenset) or not all(isinstance(v, str) for v in values):
        raise TypeError("not a set of names")
    return set(values)


def _table(rows: list[list[Any]]) -> Table:
    return {
        frozenset(backends): {module: set(names) for module, names in modules.items()}
        for backends, modules in rows
    }


def _write(file: Path, data: dict[str, Any]) -> None:
    """Atomically: ranks starting together may write the same file at once."""
    import tempfile

    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
