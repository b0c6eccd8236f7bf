"""The BLAS a rank's MLX multiplies with on Linux, and switching it to an optimized one.

mlx[cpu]'s Linux wheel bundles the reference BLAS (`mlx_cpu.libs/libblas-*.so.3`): a matmul
runs at a few GFLOP/s whatever its row count, so a forward over k tokens costs k× one token. A
system OpenBLAS preloaded in its place (LD_PRELOAD: the dynamic linker binds libmlx's
`cblas_sgemm` and LAPACK calls to the first definition, the preloaded one) does one row about
2× faster, 8 rows about 10× and 64 rows about 25× (576×1536 float32, one thread): checking k
drafted tokens then costs little more than one token, as on a Mac (Accelerate).

A rank on Linux decides once, right after reading its job line (cluster/rank.py): unless
MLX_CLUSTER_BLAS=reference, LD_PRELOAD already names an optimized BLAS, or none is installed, it
executes itself again with LD_PRELOAD naming the library (appended to any value it had),
OPENBLAS_NUM_THREADS = this host's cores / the job's ranks on this host (unless set), and
MLX_CLUSTER_BLAS_PRELOADED naming the library (so it happens once). The job line is handed over
in a memfd (MLX_CLUSTER_JOB_FD): the first process read exactly that line from stdin, byte by
byte, so what follows it is still in the pipe for the new process.

MLX_CLUSTER_BLAS: `auto` (default: a system OpenBLAS when there is one), `reference` (keep the
bundled one), or the absolute path of a BLAS library to preload — a path only from the rank's
own environment, never from the job's `env` (a cluster file may not make ranks load code, as
with LD_PRELOAD itself).

`python -m cluster.blas` prints what a rank started here would use, one line: `openblas PATH`,
`reference`, `accelerate`, or `other PATH` (the topology probe's blas.txt). No MLX and nothing
outside the standard library is imported: this runs before MLX, and on hosts the launcher probes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from cluster.host_cores import cores, ranks_on_this_host
from cluster.job import RankJob
from topology.errors import InputError

CHOICE_ENV = "MLX_CLUSTER_BLAS"  # auto | reference | /path/to/lib.so
MARKER_ENV = "MLX_CLUSTER_BLAS_PRELOADED"  # set by the re-execution: the library it preloaded
JOB_FD_ENV = "MLX_CLUSTER_JOB_FD"  # the memfd holding the job line, for the re-executed rank
THREADS_ENV = "OPENBLAS_NUM_THREADS"
REFERENCE = "reference (bundled with mlx[cpu])"
ACCELERATE = "accelerate"
_OPTIMIZED = re.compile(r"openblas|mkl|blis", re.IGNORECASE)  # a library name that is one
_MAX_JOB_BYTES = 256 << 20
_SYMBOL = "cblas_sgemm"  # what libmlx calls for a float32 matmul


def _multiarch() -> str:
    import sysconfig

    return str(sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu")


def openblas_candidates(multiarch: str) -> tuple[str, ...]:
    """Where distributions install OpenBLAS, best first: Debian/Ubuntu's alternatives link (the
    variant the admin chose), then its pthread, openmp and serial variants; Fedora/RHEL's
    pthread, openmp and serial builds; Arch's."""
    d = f"/usr/lib/{multiarch}"
    return (
        f"{d}/libopenblas.so.0",
        f"{d}/openblas-pthread/libopenblas.so.0",
        f"{d}/openblas-openmp/libopenblas.so.0",
        f"{d}/openblas-serial/libopenblas.so.0",
        "/usr/lib64/libopenblasp.so.0",
        "/usr/lib64/libopenblaso.so.0",
        "/usr/lib64/libopenblas.so.0",
        "/usr/lib/libopenblas.so.0",
    )


def _elf_kind(path: str) -> bytes | None:
    """ELF class, byte order and machine: what must match for the library to load here."""
    try:
        with open(os.path.realpath(path), "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return head[4:6] + head[18:20]


def loadable(path: str) -> bool:
    """An ELF shared library this interpreter's architecture can load."""
    mine = _elf_kind(sys.executable)
    return os.path.isfile(path) and mine is not None and _elf_kind(path) == mine


def find_openblas(multiarch: str | None = None) -> str | None:
    """The first OpenBLAS installed on this host that this process can load."""
    return next(
        (p for p in openblas_candidates(multiarch or _multiarch()) if loadable(p)),
        None,
    )


def _preload_entries(value: str) -> list[str]:
    return [e for e in re.split(r"[:\s]+", value) if e]  # ld.so splits on colons and spaces


def optimized_preload(ld_preload: str) -> str | None:
    """An entry of LD_PRELOAD that is an optimized BLAS (OpenBLAS, MKL, BLIS), if any."""
    return next(
        (e for e in _preload_entries(ld_preload) if _OPTIMIZED.search(os.path.basename(e))),
        None,
    )


def choose(environ: Mapping[str, str], job_env: Mapping[str, str]) -> str | None:
    """The library to preload by executing again, or None to keep what this process has.
    Raises InputError for an MLX_CLUSTER_BLAS that names nothing usable."""
    if not sys.platform.startswith("linux") or MARKER_ENV in environ:
        return None
    setting = job_env.get(CHOICE_ENV, environ.get(CHOICE_ENV, "auto")).strip()
    preload = environ.get("LD_PRELOAD", "")
    if setting == "reference":
        return None
    if setting in ("", "auto", "openblas"):
        return None if optimized_preload(preload) else find_openblas()
    if not setting.startswith("/"):
        raise InputError(
            f"{CHOICE_ENV}={setting!r}: use auto, reference or the absolute path of a BLAS library"
        )
    if CHOICE_ENV in job_env:
        raise InputError(
            f"{CHOICE_ENV}={setting} in the job's env: a library path is taken only from the "
            "rank's own environment (as LD_PRELOAD is); use auto or reference there"
        )
    if not loadable(setting):
        raise InputError(
            f"{CHOICE_ENV}={setting}: not a shared library this host's python can load"
        )
    return None if setting in _preload_entries(preload) else setting


def threads_for(job: RankJob) -> int | None:
    """OpenBLAS threads for this rank: the cores it may run on shared by the ranks on this host
    (at least 1), so N ranks on one host do not oversubscribe it; None when unknown."""
    ranks = ranks_on_this_host(job)
    return None if ranks is None else max(1, cores() // max(1, ranks))


def preload_env(
    environ: Mapping[str, str], job_env: Mapping[str, str], library: str, threads: int | None
) -> dict[str, str]:
    """The environment of the re-executed rank. Everything else is kept as it is (the host's
    OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE, …); the thread count is read when the library loads,
    so one the job's env sets is applied here, before that."""
    env = dict(environ)
    old = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{old}:{library}" if old else library
    env[MARKER_ENV] = library
    variables = [THREADS_ENV]
    if "openmp" in os.path.realpath(library) or os.path.basename(library) == "libopenblaso.so.0":
        variables.append("OMP_NUM_THREADS")  # the OpenMP build sizes its pool from OpenMP's
    for name in variables:
        value = job_env.get(name) or environ.get(name) or (str(threads) if threads else None)
        if value:
            env[name] = value
    return env


def switch(job: RankJob, job_line: str) -> None:
    """Execute this rank again with an optimized BLAS preloaded when that applies (see the
    module's docstring); returns when nothing changes. Raises InputError for a bad setting."""
    library = choose(os.environ, job.env)
    if library is None or not sys.executable:
        return
    env = preload_env(os.environ, job.env, library, threads_for(job))
    try:
        fd = os.memfd_create("mlx-cluster-job", 0)
    except (AttributeError, OSError):
        return  # no way to hand the job over: keep the bundled BLAS
    try:
        data = job_line.encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
        env[JOB_FD_ENV] = str(fd)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
        # sys.orig_argv keeps `-m cluster.rank` and any interpreter flags; fd 0 (the rest of
        # the launcher's lines), 1 and 2 carry over as they are.
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        os.close(fd)


def handed_job_line() -> str | None:
    """In a re-executed rank: the job line the first process read (then the memfd is closed
    and the variable dropped, so nothing started later inherits them); else None."""
    raw = os.environ.pop(JOB_FD_ENV, None)
    if raw is None:
        return None
    fd = int(raw)  # ValueError: reported as a bad job line
    chunks, size = [], 0
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_JOB_BYTES:
                raise ValueError(f"the job handed over in fd {fd} is too large")
    except OSError as e:
        raise ValueError(f"cannot read the job handed over in fd {fd}: {e.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def use_in_this_process(environ: Mapping[str, str] | None = None) -> str | None:
    """Load the library a rank here would preload into this process's global scope (dlopen with
    RTLD_GLOBAL: libraries loaded later bind to it first), so MLX imported afterwards multiplies
    with it as the ranks do: for a process whose results are compared with theirs (the tests'
    single-process references). Returns the library; None when a rank would keep what it has
    (MLX_CLUSTER_BLAS=reference, LD_PRELOAD naming one already, not Linux, none installed)."""
    if "mlx.core" in sys.modules:
        raise RuntimeError("cluster.blas.use_in_this_process: MLX is imported already")
    library = choose(os.environ if environ is None else environ, {})
    if library is not None:
        ctypes.CDLL(library, mode=os.RTLD_GLOBAL)
    return library


# --- what is in use (after MLX is imported) -------------------------------------------------


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def defining_library(symbol: str) -> str | None:
    """The file of the definition of `symbol` in the global scope (the executable, its
    libraries, LD_PRELOAD): where the dynamic linker binds libmlx's call, as it searches the
    global scope before libmlx's own dependencies. None when there is none."""
    try:
        process = ctypes.CDLL(None)
        address = ctypes.cast(getattr(process, symbol), ctypes.c_void_p).value
        dladdr = process.dladdr
    except (AttributeError, OSError, ValueError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not address or not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def _defines(path: str, symbol: str) -> bool:
    """Whether the already loaded library at `path` defines `symbol` (nothing is loaded)."""
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    return hasattr(lib, symbol)


def mapped_blas(maps: str | None = None) -> list[str]:
    """BLAS libraries mapped into this process (/proc/self/maps), in load order."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return []
    found: list[str] = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        path = parts[5].strip() if len(parts) == 6 else ""
        name = os.path.basename(path)
        blas = path.startswith("/") and ("blas" in name or _OPTIMIZED.search(name))
        if blas and path not in found:
            found.append(path)
    return found


def _openblas(path: str) -> str:
    """`openblas 0.3.21, 2 threads (PATH)`, as far as the library tells."""
    details = []
    try:
        lib = ctypes.CDLL(path)  # already loaded: the same handle
        lib.openblas_get_config.restype = ctypes.c_char_p
        config = (lib.openblas_get_config() or b"").decode(errors="replace").split()
        if len(config) > 1 and config[0].lower() == "openblas":
            details.append(config[1])
        threads = int(lib.openblas_get_num_threads())
        details.append(f"{threads} thread{'s' * (threads != 1)}")
    except (AttributeError, OSError, ValueError):
        pass
    head = " ".join(["openblas", *details[:1]])
    return f"{head}, {details[1]} ({path})" if len(details) > 1 else f"{head} ({path})"


def _bundled(path: str) -> bool:
    return "mlx_cpu.libs" in path or "/mlx/lib/" in path


def describe(path: str) -> str:
    if _bundled(path):
        return REFERENCE
    if "openblas" in os.path.basename(path).lower():
        return _openblas(path)
    return f"{os.path.basename(path)} ({path})"


def in_use() -> str:
    """The BLAS this process's MLX calls, for the rank's `load` event: `accelerate` on macOS;
    on Linux the library defining cblas_sgemm in the global scope (a preloaded one), else the
    BLAS MLX's own library brought (the bundled reference one, for mlx[cpu])."""
    if sys.platform == "darwin":
        return ACCELERATE
    if not sys.platform.startswith("linux"):
        return "unknown"
    bound = defining_library(_SYMBOL)
    if bound is not None:
        return describe(bound)
    # Not in the global scope: libmlx binds to one of its own dependencies (numpy's OpenBLAS,
    # also mapped, names its symbols apart and does not count).
    mapped = [p for p in mapped_blas() if _defines(p, _SYMBOL)]
    mapped.sort(key=lambda p: not _bundled(p))
    return describe(mapped[0]) if mapped else "unknown"


def probe_line(environ: Mapping[str, str] | None = None) -> str:
    """What a rank started here would use, as blas.txt records it (see the module docstring)."""
    environ = os.environ if environ is None else environ
    if sys.platform == "darwin":
        return ACCELERATE
    try:
        library = choose(environ, {})
    except InputError:
        library = None
    if library is None and environ.get(CHOICE_ENV, "").strip() != "reference":
        library = optimized_preload(environ.get("LD_PRELOAD", ""))
    if library is None:
        return "reference"
    kind = "openblas" if "openblas" in os.path.basename(library).lower() else "other"
    return f"{kind} {library}"


if __name__ == "__main__":
    print(probe_line())


@functools.cache  # one handle per process: the library and its symbols do not change
def _preloaded_openblas() -> Any | None:
    """The OpenBLAS this rank preloaded, through ctypes (None: none preloaded, or not OpenBLAS)."""
    library = os.environ.get(MARKER_ENV)
    if not library:
        return None
    try:
        lib = ctypes.CDLL(library)  # already mapped: the same library, not a second copy
        lib.openblas_get_num_threads.restype = ctypes.c_int
        lib.openblas_set_num_threads.argtypes = [ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return lib


def blas_threads() -> int | None:
    """The preloaded OpenBLAS's thread count now; None when there is none."""
    lib = _preloaded_openblas()
    return int(lib.openblas_get_num_threads()) if lib is not None else None


def set_blas_threads(n: int) -> bool:
    """Set the preloaded OpenBLAS's thread count (the microbenchmark's one-thread pass)."""
    lib = _preloaded_openblas()
    if lib is None:
        return False
    lib.openblas_set_num_threads(n)
    return True
