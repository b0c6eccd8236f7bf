"""Where the repository, the test fixtures and the programs under test are, for every test module.

The programs are the console scripts installed beside the interpreter running the tests (a venv's
bin/, wherever it lives), never a path guessed from the repository."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Not resolved: a venv's python is a symlink to the base interpreter, which has no mlx-cluster.
PYTHON = Path(sys.executable)
BIN = PYTHON.parent
MLX_CLUSTER = BIN / "mlx-cluster"
MLX_LAUNCH = BIN / "mlx.launch"
