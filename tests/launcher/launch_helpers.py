"""Run the real `mlx-cluster launch` in a subprocess and find its ranks in /proc.

Each launch gets a unique marker in its environment; local ranks inherit it, so a /proc scan
finds exactly this test's `python -m cluster.rank` processes (other tests may run ranks too).
Local ranks also carry MLX_RANK in their environment (as mlx.launch exports it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import paths
import pytest

from cluster.tiny_model import write_tiny_model
from launcher.ranks.marked import marked_rank_pids

ROOT = Path(__file__).resolve().parents[2]
MLX_CLUSTER = str(paths.MLX_CLUSTER)
MARKER_VAR = "MLX_CLUSTER_TEST_MARKER"
PROMPT = "Hello world"
LAUNCH_TIMEOUT_S = 90.0  # a whole launch, loading included; every wait is bounded


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 layers, 4 heads / 2 KV heads: divides over 1 and 2 ranks."""
    return write_tiny_model(tmp_path_factory.mktemp("launch") / "tiny", layers=4, hidden=64)


def rank_pids(marker: str) -> dict[int, int]:
    """{MLX_RANK: pid} of the live `cluster.rank` processes carrying this marker."""
    return marked_rank_pids(MARKER_VAR, marker)


class CliProcess:
    """A running `mlx-cluster ARGS...` marked so its ranks can be found; output kept by threads."""

    def __init__(self, *argv: str) -> None:
        self.marker = uuid.uuid4().hex
        env = {**os.environ, MARKER_VAR: self.marker}
        self.proc = subprocess.Popen(
            [MLX_CLUSTER, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self._err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        fd = stream.fileno()  # type: ignore[attr-defined]
        while chunk := os.read(fd, 4096):
            into.append(chunk.decode(errors="replace"))

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def ranks(self, n: int, timeout_s: float = 10.0) -> dict[int, int]:
        """The pids of all n ranks, by rank."""
        end = time.monotonic() + timeout_s
        while len(found := rank_pids(self.marker)) < n:
            assert time.monotonic() < end, f"found only ranks {found}"
            time.sleep(0.05)
        return found


class Launch(CliProcess):
    """A running `mlx-cluster launch ...`."""

    def __init__(self, *args: str) -> None:
        super().__init__("launch", *args)

    def wait_for_text(self, timeout_s: float = LAUNCH_TIMEOUT_S) -> None:
        """Until rank 0 has streamed some text (decoding is under way)."""
        end = time.monotonic() + timeout_s
        while not self.stdout.strip():
            assert self.proc.poll() is None, f"launch ended before any text:\n{self.stderr}"
            assert time.monotonic() < end, f"no text within {timeout_s} s:\n{self.stderr}"
            time.sleep(0.05)

    def wait(self, timeout_s: float = LAUNCH_TIMEOUT_S) -> int:
        code = self.proc.wait(timeout=timeout_s)
        for t in self._readers:
            t.join(5.0)
        return code

    def leftover_ranks(self, settle_s: float = 1.0) -> dict[int, int]:
        """Ranks still alive settle_s after the launcher exited (a SIGKILL takes a moment)."""
        end = time.monotonic() + settle_s
        while (left := rank_pids(self.marker)) and time.monotonic() < end:
            time.sleep(0.05)
        return left

    def cleanup(self) -> None:
        """Whatever a failed test left: the launcher and this marker's ranks."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for pid in rank_pids(self.marker).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def launched(*args: str) -> Iterator[Launch]:
    run = Launch(*args)
    try:
        yield run
    finally:
        run.cleanup()
