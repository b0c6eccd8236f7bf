"""Fixtures for the rank tests: tiny models built once per session, offline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
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
