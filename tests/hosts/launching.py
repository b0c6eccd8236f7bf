"""Running the real `mlx-cluster` CLI against emulated hosts, and finding ranks inside them."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from paths import MLX_CLUSTER

from hosts.netns import VENV_PYTHON, EmulatedHosts

CLI = MLX_CLUSTER


def _env() -> dict[str, str]:
    # Read at call time: tests point MLX_CLUSTER_CACHE at a temp dir (no user calibration).
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


_REFERENCE = """
import json, sys
from mlx_lm import load, stream_generate
model, tok = load(sys.argv[1])
prompt = tok.apply_chat_template(
    [{"role": "user", "content": sys.argv[2]}], add_generation_prompt=True
)
steps = stream_generate(model, tok, prompt, max_tokens=int(sys.argv[3]))
print(json.dumps([r.token for r in steps]))
"""


def reference_tokens(model: Path, prompt: str, max_tokens: int) -> list[int]:
    """Greedy tokens from plain mlx-lm in one process: what every cluster run must equal."""
    argv = [str(VENV_PYTHON), "-c", _REFERENCE, str(model), prompt, str(max_tokens)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(), check=True)
    tokens: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return tokens


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, timeout=timeout, env=_env()
    )


def launch_json(cluster: Path, *args: str, timeout: float = 180) -> dict[str, Any]:
    done = cli("launch", str(cluster), "--json", *args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


class Streaming:
    """`mlx-cluster launch` in the background, its stdout/stderr collected as they arrive."""

    def __init__(self, cluster: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [str(CLI), "launch", str(cluster), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
        )
        self.out, self.err = bytearray(), bytearray()
        self.first_text = threading.Event()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream: Any, into: bytearray) -> None:
        while chunk := os.read(stream.fileno(), 4096):
            into += chunk
            if into is self.out:
                self.first_text.set()

    def wait_for_text(self, timeout_s: float) -> None:
        """Block until rank 0 streamed text (the ranks are decoding)."""
        if not self.first_text.wait(timeout_s):
            self.proc.kill()
            raise AssertionError(f"no text within {timeout_s}s: {self.stderr()}")

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        for t in self._readers:
            t.join(5)
        return code

    def stderr(self) -> str:
        return self.err.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def rank_pids(hosts: EmulatedHosts, i: int) -> list[int]:
    """`python -m cluster.rank` processes living in host i."""
    return [p for p in hosts.pids(i) if "cluster.rank" in _cmdline(p)]


def session_pids(hosts: EmulatedHosts, i: int) -> list[int]:
    """Everything in host i except its listening sshd: ranks, sshd sessions, shells."""
    sshd = hosts[i].sshd
    listener = sshd.pid if sshd is not None else -1
    return [p for p in hosts.pids(i) if p != listener and _cmdline(p)]


def wait_until_empty(
    hosts: EmulatedHosts, timeout_s: float, start: float, ranks_only_on: Sequence[int] = ()
) -> float:
    """Seconds from `start` until no host holds anything but its sshd (only no rank, for hosts
    in `ranks_only_on`: an unplugged host's sshd session cannot learn its client is gone)."""
    while True:
        left = {
            h.name: rank_pids(hosts, h.index)
            if h.index in ranks_only_on
            else session_pids(hosts, h.index)
            for h in hosts
        }
        if not any(left.values()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            detail = {n: [" ".join(_cmdline(p)) for p in ps] for n, ps in left.items() if ps}
            raise AssertionError(f"still running after {timeout_s}s: {detail}")
        time.sleep(0.1)


def wait_for_ranks(hosts: EmulatedHosts, on: Sequence[int], timeout_s: float) -> dict[int, int]:
    """The rank pid on each host of `on`, once every one is running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = {i: rank_pids(hosts, i) for i in on}
        if all(found.values()):
            return {i: pids[0] for i, pids in found.items()}
        time.sleep(0.1)
    raise AssertionError(f"ranks not running on hosts {list(on)} after {timeout_s}s")


def link_bytes(hosts: EmulatedHosts, i: int, dev: str) -> int:
    """Bytes host i sent on interface `dev` so far."""
    path = f"/sys/class/net/{dev}/statistics/tx_bytes"
    return int(hosts.run(i, ["cat", path], check=True).stdout)
