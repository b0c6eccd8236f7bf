"""cluster/blas.py's decisions without starting a rank: which library to preload, the threads,
the environment of the re-executed rank, the job handed over, and what is reported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from rankrun import host_job

from cluster import blas
from cluster.job import RankJob
from topology.errors import InputError

OPENBLAS = blas.find_openblas()
needs_openblas = pytest.mark.skipif(
    OPENBLAS is None and os.environ.get("CI") != "true",
    reason="no OpenBLAS on this host (scripts/ci_system_deps installs libopenblas0-pthread)",
)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ranks only")


def test_candidates_start_with_debian_paths_and_cover_other_distributions() -> None:
    found = blas.openblas_candidates("x86_64-linux-gnu")
    assert found[:4] == (
        "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
        "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
        "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
        "/usr/lib/x86_64-linux-gnu/openblas-serial/libopenblas.so.0",
    )
    assert "/usr/lib64/libopenblasp.so.0" in found and "/usr/lib/libopenblas.so.0" in found


@linux_only
def test_loadable_checks_the_elf_header(tmp_path: object) -> None:
    assert blas.loadable(os.path.realpath(sys.executable))  # same class and machine as itself
    assert not blas.loadable("/no/such/libopenblas.so.0")
    assert not blas.loadable(__file__)  # not ELF


@linux_only
@needs_openblas
def test_choose_finds_openblas_unless_told_otherwise() -> None:
    assert OPENBLAS is not None
    assert blas.choose({}, {}) == OPENBLAS
    assert blas.choose({"MLX_CLUSTER_BLAS": "auto"}, {}) == OPENBLAS
    assert blas.choose({"MLX_CLUSTER_BLAS": "reference"}, {}) is None
    assert blas.choose({}, {"MLX_CLUSTER_BLAS": "reference"}) is None  # the cluster file's env
    assert blas.choose({blas.MARKER_ENV: OPENBLAS}, {}) is None  # executed again already
    assert blas.choose({"LD_PRELOAD": "/opt/intel/libmkl_rt.so"}, {}) is None  # has one
    assert blas.choose({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, {}) == OPENBLAS
    forced = os.path.realpath(OPENBLAS)
    assert blas.choose({"MLX_CLUSTER_BLAS": forced}, {}) == forced
    assert blas.choose({"MLX_CLUSTER_BLAS": forced, "LD_PRELOAD": forced}, {}) is None


@linux_only
def test_choose_refuses_what_names_nothing_usable() -> None:
    with pytest.raises(InputError, match="use auto, reference or the absolute path"):
        blas.choose({"MLX_CLUSTER_BLAS": "fast"}, {})
    with pytest.raises(InputError, match="not a shared library"):
        blas.choose({"MLX_CLUSTER_BLAS": "/no/such/lib.so"}, {})
    # a path from the job's env (a cluster file) would make ranks load code: refused
    with pytest.raises(InputError, match="only from the rank's own environment"):
        blas.choose({}, {"MLX_CLUSTER_BLAS": os.path.realpath(sys.executable)})


def test_threads_share_the_cores_between_the_ranks_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blas, "cores", lambda: 8)
    assert blas.threads_for(host_job(1)) == 8
    assert blas.threads_for(host_job(2)) == 4
    assert blas.threads_for(host_job(16)) == 1  # at least one
    assert blas.threads_for(host_job(2, files={})) is None


def test_preload_env_appends_and_keeps_the_hosts_settings() -> None:
    environ = {
        "LD_PRELOAD": "/usr/lib/libjemalloc.so.2",
        "OPENBLAS_CORETYPE": "Haswell",
        "OPENBLAS_L2_SIZE": "512",
        "PATH": "/usr/bin",
    }
    lib = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
    env = blas.preload_env(environ, {}, lib, 3)
    assert env["LD_PRELOAD"] == f"/usr/lib/libjemalloc.so.2:{lib}"
    assert env[blas.MARKER_ENV] == lib and env["OPENBLAS_NUM_THREADS"] == "3"
    assert {k: env[k] for k in environ if k != "LD_PRELOAD"} == {
        k: v for k, v in environ.items() if k != "LD_PRELOAD"
    }
    assert blas.preload_env({}, {}, lib, 3)["LD_PRELOAD"] == lib
    # the user's count wins; the job's env wins over the process's (it is read at load time)
    assert (
        blas.preload_env({"OPENBLAS_NUM_THREADS": "2"}, {}, lib, 3)["OPENBLAS_NUM_THREADS"] == "2"
    )
    both = blas.preload_env({"OPENBLAS_NUM_THREADS": "2"}, {"OPENBLAS_NUM_THREADS": "5"}, lib, 3)
    assert both["OPENBLAS_NUM_THREADS"] == "5"
    assert "OPENBLAS_NUM_THREADS" not in blas.preload_env({}, {}, lib, None)
    assert "OMP_NUM_THREADS" not in env
    omp = blas.preload_env({}, {}, "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", 2)
    assert omp["OMP_NUM_THREADS"] == "2"  # the OpenMP build sizes its pool from OpenMP's


@linux_only
def test_the_job_line_is_handed_over_through_an_inherited_fd() -> None:
    line = RankJob(rank=0, world_size=1, backend="ring", strategy="tensor", model="m").to_line()
    fd = os.memfd_create("t", 0)
    os.write(fd, line.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    code = (
        "from cluster import blas; import os; "
        "print(repr(blas.handed_job_line()), blas.JOB_FD_ENV in os.environ)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, blas.JOB_FD_ENV: str(fd)},
        capture_output=True,
        text=True,
        close_fds=False,
        check=True,
    )
    os.close(fd)
    assert done.stdout == f"{line!r} False\n"  # the variable is dropped for later children
    with pytest.raises(ValueError, match="cannot read the job"):
        os.environ[blas.JOB_FD_ENV] = "987"
        blas.handed_job_line()
    assert blas.handed_job_line() is None


def test_mapped_blas_reads_proc_maps_lines() -> None:
    maps = "\n".join(
        [
            "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6",
            "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libopenblas.so.0",
            "7f04-7f05 r--p 00001000 08:01 2 /usr/lib/x86_64-linux-gnu/libopenblas.so.0",
            "7f06-7f07 r-xp 00000000 08:01 3 /v/site-packages/mlx_cpu.libs/libblas-bd8.so.3",
            "7f08-7f09 rw-p 00000000 00:00 0 ",
            "7f0a-7f0b rw-p 00000000 00:00 0 [heap]",
        ]
    )
    assert blas.mapped_blas(maps) == [
        "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
        "/v/site-packages/mlx_cpu.libs/libblas-bd8.so.3",
    ]
    assert blas.describe("/v/site-packages/mlx_cpu.libs/libblas-bd8.so.3") == blas.REFERENCE


@linux_only
def _in_a_fresh_python(code: str, **env: str) -> str:
    """stdout of `code` in a new interpreter with nothing deciding the BLAS but `env`."""
    unset = ("LD_PRELOAD", blas.CHOICE_ENV, blas.MARKER_ENV, blas.THREADS_ENV)
    clean = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@linux_only
def test_in_use_is_mlx_cpus_own_blas_without_a_preload() -> None:
    code = "from cluster import blas; import mlx.core; print(blas.in_use())"
    assert _in_a_fresh_python(code) == blas.REFERENCE + "\n"
    assert _in_a_fresh_python("from cluster import blas; print(blas.in_use())") == "unknown\n"


@linux_only
@needs_openblas
def test_use_in_this_process_makes_mlx_bind_to_openblas() -> None:
    """What a process comparing itself with ranks does (the tests' references): RTLD_GLOBAL."""
    code = (
        "from cluster import blas; lib = blas.use_in_this_process(); import mlx.core as mx; "
        "mx.eval(mx.ones((4, 4)) @ mx.ones((4, 4))); print(lib); print(blas.in_use())"
    )
    lib, used = _in_a_fresh_python(code, OPENBLAS_NUM_THREADS="1").splitlines()
    assert lib == OPENBLAS and used == f"openblas {used.split()[1]} 1 thread ({OPENBLAS})"
    kept = _in_a_fresh_python(code, MLX_CLUSTER_BLAS="reference").splitlines()
    assert kept == ["None", blas.REFERENCE]
    late = "import mlx.core; from cluster import blas; blas.use_in_this_process()"
    done = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True)
    assert done.returncode == 1 and "MLX is imported already" in done.stderr


@linux_only
def test_probe_line_says_what_a_rank_here_would_use() -> None:
    assert blas.probe_line({"MLX_CLUSTER_BLAS": "reference"}) == "reference"
    assert blas.probe_line({"MLX_CLUSTER_BLAS": "nonsense"}) == "reference"  # the rank refuses
    assert blas.probe_line({"LD_PRELOAD": "/opt/libmkl_rt.so"}) == "other /opt/libmkl_rt.so"
    expected = f"openblas {OPENBLAS}" if OPENBLAS else "reference"
    assert blas.probe_line({}) == expected
    done = subprocess.run(
        [sys.executable, "-m", "cluster.blas"],
        env={k: v for k, v in os.environ.items() if k not in ("MLX_CLUSTER_BLAS", "LD_PRELOAD")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == expected + "\n" and done.stderr == ""
