"""transformers' lazy-import table read from disk (cluster/transformers_table.py): built once,
then read by every process; the same table as transformers builds; built again when the folder
or the file changes; transformers left to itself when the cache cannot serve."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import transformers  # noqa: F401  (the table's key names its version, as in a rank)

from cluster.transformers_table import cached

ROOT = Path(__file__).resolve().parents[2]
TABLE = {
    frozenset(): {"models.a.configuration_a": {"AConfig"}},
    frozenset({"tokenizers"}): {"models.a.tokenization_a_fast": {"ATokenizerFast", "Other"}},
}


class Builder:
    """A stand-in for transformers' define_import_structure that counts its scans."""

    def __init__(self, table: Any = TABLE) -> None:
        self.table, self.calls = table, 0

    def __call__(self, module_path: Any, prefix: str | None = None) -> Any:
        self.calls += 1
        return self.table


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    return models


def test_built_once_then_read_by_every_process(folder: Path, tmp_path: Path) -> None:
    build = Builder()
    first = cached(build, tmp_path / "cache")(folder, prefix="models")
    assert first == TABLE and build.calls == 1
    assert cached(build, tmp_path / "cache")(folder, "models") == TABLE  # a second process
    assert build.calls == 1
    assert cached(build, tmp_path / "cache")(folder) == TABLE  # another prefix: its own entry
    assert build.calls == 2
    again = cached(build, tmp_path / "cache")
    again(folder, "models")
    again(folder, "models")
    assert build.calls == 2


def test_a_folder_changed_builds_it_again(folder: Path, tmp_path: Path) -> None:
    build = Builder()
    cached(build, tmp_path / "cache")(folder, "models")
    (folder / "new_model").mkdir()  # an upgrade adds a model: the folder's mtime moves
    assert cached(build, tmp_path / "cache")(folder, "models") == TABLE
    assert build.calls == 2


def test_a_damaged_file_is_built_again_and_replaced(folder: Path, tmp_path: Path) -> None:
    build = Builder()
    cached(build, tmp_path / "cache")(folder, "models")
    [file] = (tmp_path / "cache").iterdir()
    stamp = json.loads(file.read_text())["stamp"]
    rows_not_as_written = json.dumps({"stamp": stamp, "table": [[["a"], "not a dict"]]})
    for damage in ("{not json", json.dumps({"stamp": 1}), json.dumps([1, 2]), rows_not_as_written):
        file.write_text(damage)
        assert cached(build, tmp_path / "cache")(folder, "models") == TABLE
        assert json.loads(file.read_text())["table"]  # written anew
    assert build.calls == 5
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [file.name]  # no leftovers


def test_a_cache_that_cannot_be_written_still_answers(folder: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    build = Builder()
    for _ in range(2):
        assert cached(build, blocked / "cache")(folder, "models") == TABLE
    assert build.calls == 2


def test_a_table_of_another_shape_is_not_kept(folder: Path, tmp_path: Path) -> None:
    odd = {frozenset({1}): {"m": {"X"}}}  # not names: JSON would not give it back as it was
    build = Builder(odd)
    assert cached(build, tmp_path / "cache")(folder, "models") is odd
    assert not (tmp_path / "cache").exists()
    assert cached(build, tmp_path / "cache")(folder, "models") is odd
    assert build.calls == 2


_PROCESS = """
import json, sys
from pathlib import Path
from cluster.transformers_table import install
if sys.argv[1] == "on":
    install(Path(sys.argv[2]))
from mlx_lm.utils import load_tokenizer
import transformers.utils.import_utils as iu
tokenizer = load_tokenizer(Path(sys.argv[3]))
ids = tokenizer.encode("Tell me about the sea")
scans = iu.create_import_structure_from_path.cache_info().misses
same = None
if sys.argv[1] == "on":  # every table on disk equals the one transformers builds afresh (what
    # the process was handed has since been added to by transformers/__init__, as before)
    from cluster.transformers_table import load_or_build
    def refuse(*args):
        raise AssertionError("built again")
    build = iu.define_import_structure
    same = [
        load_or_build(refuse, path, prefix, Path(sys.argv[2])) == build.__wrapped__(path, prefix)
        for path, prefix in build.made
    ]
print(json.dumps({"ids": ids, "scans": scans, "same": same, "type": type(tokenizer).__name__}))
"""


def _process(mode: str, cache: Path, model: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _PROCESS, mode, str(cache), str(model)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return out


def test_a_process_reads_transformers_table_and_tokenizes_alike(
    tmp_path: Path, tiny: Callable[[str], Path]
) -> None:
    """The first process builds the table (and writes it), the next scans no folder at all,
    and both load the model's tokenizer and tokenize as a process without the cache."""
    tiny_llama = tiny("llama")
    plain = _process("off", tmp_path / "cache", tiny_llama)
    assert plain["scans"] > 0 and plain["same"] is None
    first = _process("on", tmp_path / "cache", tiny_llama)
    assert list((tmp_path / "cache").glob("*.json"))
    warm = _process("on", tmp_path / "cache", tiny_llama)
    assert warm["scans"] == 0, warm
    for run in (first, warm):
        assert run["same"] and all(run["same"]), run
        assert (run["ids"], run["type"]) == (plain["ids"], plain["type"])
