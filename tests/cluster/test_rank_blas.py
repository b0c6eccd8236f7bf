"""Ranks started as the launcher starts them (`python -m cluster.rank`, job line on stdin) use
the host's OpenBLAS: preloaded by executing themselves again, reported in their `load` event,
visible in /proc; `MLX_CLUSTER_BLAS=reference` keeps mlx[cpu]'s own. Either way a 2-rank
tensor run answers with the single process's greedy tokens, and lines the launcher wrote after
the job (before the rank executed itself again) still arrive."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rankrun import Rank, Ranks, ring_jobs, run_ranks
from serving import ServeRanks, batch_reference, request

from cluster import blas

OPENBLAS = blas.find_openblas()
PROMPT_IDS = [5, 17, 42, 8, 99, 3, 61, 27]
MAX_TOKENS = 12

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ranks only")


def _proc(rank: Rank) -> tuple[dict[str, str], str]:
    """The rank's environment as it was executed, and its memory map."""
    pid = rank.proc.pid
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    environ = dict(i.decode(errors="replace").partition("=")[::2] for i in raw if i)
    return environ, Path(f"/proc/{pid}/maps").read_text()


def _need_openblas(setting: str) -> None:
    if setting != "reference" and OPENBLAS is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no OpenBLAS installed: run scripts/ci_system_deps")
        pytest.skip("no OpenBLAS on this host (scripts/ci_system_deps installs it)")


@pytest.mark.parametrize("setting", ["auto", "reference", "path"])
def test_tensor_ranks_report_their_blas_and_give_the_single_process_tokens(
    tiny: Callable[[str], Path], setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _need_openblas(setting)
    for name in ("LD_PRELOAD", blas.CHOICE_ENV, blas.MARKER_ENV, blas.THREADS_ENV):
        monkeypatch.delenv(name, raising=False)  # the ranks decide from what is set here only
    model = tiny("llama")
    expected = batch_reference(model, [PROMPT_IDS], MAX_TOKENS)[0]  # this process: reference
    forced = os.path.realpath(OPENBLAS) if OPENBLAS else ""
    value = {"auto": "auto", "reference": "reference", "path": forced}[setting]
    ranks = Ranks(ring_jobs(2, model, "tensor", mode="serve"), {blas.CHOICE_ENV: value})
    served = ServeRanks(ranks)
    served.line(request("r", PROMPT_IDS, MAX_TOKENS))  # in the pipe before the exec
    try:
        assert served.done("r")["token_ids"] == expected
        seen = [
            (list(r.stderr), r.event("started"), r.event("load"), *_proc(r)) for r in ranks.ranks
        ]
    finally:
        ranks.kill()  # (a rank whose ring peer is killed first complains on stderr)
    for rank, (stderr, started, load, environ, maps) in zip(ranks.ranks, seen, strict=True):
        assert stderr == [], stderr  # nothing from the dynamic linker either
        assert started is not None and started["pid"] == rank.proc.pid  # same process
        assert load is not None
        for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # the host's own, untouched
            assert environ.get(name) == os.environ.get(name)
        preload = environ.get("LD_PRELOAD", "").split(":")
        if setting == "reference":
            assert load["blas"] == blas.REFERENCE
            assert blas.MARKER_ENV not in environ and "LD_PRELOAD" not in environ
            assert "mlx_cpu.libs/libblas" in maps
            if OPENBLAS is not None:
                assert os.path.realpath(OPENBLAS) not in maps
            continue
        assert OPENBLAS is not None
        library = OPENBLAS if setting == "auto" else forced
        assert load["blas"].startswith("openblas ") and f"({library})" in load["blas"]
        assert preload == [library] and environ[blas.MARKER_ENV] == library
        assert os.path.realpath(library) in maps  # loaded, and libmlx binds to it (global scope)
        threads = max(1, len(os.sched_getaffinity(0)) // 2)  # two ranks share this host
        assert environ[blas.THREADS_ENV] == str(threads)
        assert f"{threads} thread" in load["blas"]


def test_the_jobs_env_can_keep_the_reference_blas(tiny: Callable[[str], Path]) -> None:
    """A cluster file's `env: [MLX_CLUSTER_BLAS=reference]` reaches remote ranks too."""
    [rank] = run_ranks(
        ring_jobs(1, tiny("llama"), "tensor", max_tokens=2, env={blas.CHOICE_ENV: "reference"})
    )
    assert rank.proc.returncode == 0, rank.events[-3:]
    load = rank.event("load")
    assert load is not None and load["blas"] == blas.REFERENCE


@pytest.mark.parametrize(
    ("job_env", "process_env", "message"),
    [
        ({}, {blas.CHOICE_ENV: "fast"}, "use auto, reference or the absolute path"),
        ({blas.CHOICE_ENV: "/usr/lib/libx.so"}, {}, "only from the rank's own environment"),
    ],
)
def test_a_bad_setting_is_one_input_error_and_exit_2(
    tiny: Callable[[str], Path], job_env: dict[str, str], process_env: dict[str, str], message: str
) -> None:
    jobs = ring_jobs(1, tiny("llama"), "tensor", max_tokens=2, env=job_env)
    [rank] = Ranks(jobs, process_env).finish(60)
    assert rank.proc.returncode == 2
    [error] = [e for e in rank.events if e["event"] == "error"]
    assert error["kind"] == "input" and error["rank"] == 0 and message in error["message"]
