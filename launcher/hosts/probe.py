"""Run the snapshot commands on each host (over ssh, or here for `localhost`) and keep the output.

stdout is kept byte for byte (decoded with surrogateescape, so writing it back restores the bytes).
When a command fails, `<file>.error` says how (exit code and the first stderr lines); `uname.txt`
(`uname -s`) tells a Mac from a Linux box; `versions.txt` is what the host's configured python
(the one its ranks will run) has installed, on hosts that are not Macs `blas.txt` the BLAS
a rank there would use (`python -m cluster.blas`), and `rates.json` what that python's MLX
computes and copies per second (`python -m cluster.microbench`: a few seconds, run beside the
other commands so the probe takes hardly longer). Hosts are probed in parallel; every command
has a timeout.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from launcher.hosts.ssh import TIMED_OUT, is_local, shared_connection, ssh_argv
from topology.cluster_file import ClusterSpec, HostSpec
from topology.facts import BLAS_FILE, RATES_FILE, VERSIONS_FILE
from topology.host_facts import COMMANDS, ERROR_SUFFIX, SSH_FAILED, UNAME_FILE

COMMAND_TIMEOUT_S = 30.0  # system_profiler can take several seconds on a busy Mac
SSH_EXIT = 255  # ssh's own exit code when it could not connect or log in
_STDERR_KEEP = 2000

PROBES: dict[str, tuple[str, ...]] = {UNAME_FILE: ("uname", "-s"), **COMMANDS}
# versions.txt: `name version` per line, `-` when not installed. Reads package metadata only
# (nothing is imported), so it takes a fraction of a second even where mlx is installed.
VERSIONS_SCRIPT = """import importlib.metadata as m, platform
print("python", platform.python_version())
for p in ("mlx", "mlx-lm", "mlx-cluster"):
    try:
        v = m.version(p)
    except Exception:
        v = "-"
    print(p, v)
"""


def versions_argv(python: str) -> tuple[str, ...]:
    return (python, "-c", VERSIONS_SCRIPT)


def blas_argv(python: str) -> tuple[str, ...]:
    return (python, "-m", "cluster.blas")  # cluster/blas.py: standard library only, no MLX


def rates_argv(python: str) -> tuple[str, ...]:
    # Under the BLAS a rank there would use: cluster/microbench.py preloads it as a rank does.
    return (python, "-m", "cluster.microbench")


def _shown(file: str, python: str) -> tuple[str, ...]:
    """The command named in a file's `.error` note."""
    if file in PROBES:
        return PROBES[file]
    if file == BLAS_FILE:
        return blas_argv(python)
    if file == RATES_FILE:
        return rates_argv(python)
    return (python, "-c", "<versions script>")


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _run(argv: Sequence[str], timeout_s: float) -> tuple[int, bytes, str]:
    """(exit code, stdout, what went wrong); 127 = not found, 124 = timed out."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return 127, b"", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired as e:
        return TIMED_OUT, e.stdout or b"", f"timed out after {timeout_s:g} s"
    except OSError as e:
        return 126, b"", f"{argv[0]}: {e.strerror}"
    return done.returncode, done.stdout, _decode(done.stderr).strip()[:_STDERR_KEEP]


def _record(
    out: dict[str, str | None], file: str, cmd: Sequence[str], rc: int, stdout: bytes, err: str
) -> None:
    out[file] = _decode(stdout) if rc == 0 or stdout else None
    if rc != 0:
        first = err.splitlines()[0] if err else "no error output"
        out[file + ERROR_SUFFIX] = f"`{' '.join(cmd)}` failed (exit {rc}): {first}\n{err}\n"


def _probe(
    argv_for: dict[str, list[str]],
    remote: bool,
    timeout_s: float,
    python: str,
    unreachable: tuple[int, bytes, str] | None = None,  # how connecting failed, if it did
) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    rates: Future[tuple[int, bytes, str]] | None = None
    with ThreadPoolExecutor(max_workers=1) as beside:
        for file, argv in argv_for.items():
            if file == RATES_FILE:
                continue  # started once the host answered (below), collected at the end
            if file == BLAS_FILE and (out.get(UNAME_FILE) or "").startswith("Darwin"):
                continue  # a Mac's MLX uses Accelerate
            known = unreachable if file == UNAME_FILE else None  # no second wait for a dead host
            rc, stdout, err = known or _run(argv, timeout_s)
            if remote and rc in (SSH_EXIT, TIMED_OUT) and file == UNAME_FILE:
                # ssh itself failed or hung (unreachable, key refused, a login that never
                # ends): every file would fail the same way, each after its own timeout.
                first = err.splitlines()[0] if err else "no error output"
                reason = f"{SSH_FAILED} (exit {rc}): {first}"
                for name in argv_for:
                    out[name] = None
                    out[name + ERROR_SUFFIX] = f"{reason}\n{err}\n"
                return out
            _record(out, file, _shown(file, python), rc, stdout, err)
            if file == UNAME_FILE and RATES_FILE in argv_for:
                rates = beside.submit(_run, argv_for[RATES_FILE], timeout_s)
        if rates is not None:
            _record(out, RATES_FILE, _shown(RATES_FILE, python), *rates.result())
    return out


def probe_local(
    timeout_s: float = COMMAND_TIMEOUT_S, python: str | None = None
) -> dict[str, str | None]:
    """This machine's snapshot files (every command run here, no ssh). Ranks run here with this
    very interpreter, so its versions are the ones recorded unless `python` says otherwise."""
    python = python or sys.executable
    argv_for = {f: list(cmd) for f, cmd in PROBES.items()}
    argv_for[VERSIONS_FILE] = list(versions_argv(python))
    argv_for[BLAS_FILE] = list(blas_argv(python))
    argv_for[RATES_FILE] = list(rates_argv(python))
    return _probe(argv_for, remote=False, timeout_s=timeout_s, python=python)


def probe_host(
    spec: ClusterSpec, host: HostSpec, timeout_s: float = COMMAND_TIMEOUT_S
) -> dict[str, str | None]:
    """One host's snapshot files: locally for `localhost`, else each command an ssh session of
    one shared connection (ssh_argv's `over`); when ssh cannot connect, every file says so."""
    if is_local(host):
        return probe_local(timeout_s)
    python = spec.python_for(host)
    commands = {
        **PROBES,
        VERSIONS_FILE: versions_argv(python),
        BLAS_FILE: blas_argv(python),
        RATES_FILE: rates_argv(python),
    }
    with shared_connection(spec, host, timeout_s) as shared:
        over = shared.options
        argv_for = {f: ssh_argv(spec, host, cmd, over=over) for f, cmd in commands.items()}
        failed = shared.code in (SSH_EXIT, TIMED_OUT)
        unreachable = (shared.code, b"", shared.error) if failed else None
        return _probe(argv_for, True, timeout_s, python, unreachable)


def probe_hosts(
    spec: ClusterSpec, timeout_s: float = COMMAND_TIMEOUT_S
) -> dict[str, dict[str, str | None]]:
    """Every host's snapshot files by host name, hosts probed in parallel."""
    with ThreadPoolExecutor(max_workers=min(16, len(spec.hosts))) as pool:
        results = pool.map(lambda h: probe_host(spec, h, timeout_s), spec.hosts)
        return {h.name: files for h, files in zip(spec.hosts, results, strict=True)}
