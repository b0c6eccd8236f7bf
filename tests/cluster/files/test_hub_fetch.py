"""Ranks download a Hugging Face repo from a real local HTTP server speaking the Hub's API.

Each test process points huggingface_hub at tests/cluster/files/fake_hub.py with HF_ENDPOINT
and at a fresh cache with HF_HOME, so what a rank fetched is read from the server's request log.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paths
import pytest
from fake_hub import FakeHub, Repo, fake_hub
from rankrun import ROOT, Rank, Ranks, free_ports, ring_jobs
from references import PROMPT, reference

from cluster.load import local_files
from cluster.pipeline_stage import layer_range
from cluster.tiny_model import write_tiny_model

REPO = "org/tiny"
LAYERS, SPLIT, MAX_TOKENS = 4, (1, 3), 8
RANK_TIMEOUT_S = 90.0
MLX_CLUSTER = str(paths.MLX_CLUSTER)


def hub_env(url: str, home: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": url,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "0",
        "PYTHONPATH": str(ROOT),
    }


def dead_endpoint() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("fetch") / "tiny", layers=LAYERS)


def metadata_files(model: Path) -> set[str]:
    return {p.name for p in model.iterdir() if not p.name.endswith(".safetensors")}


def own_files(model: Path, rank: int) -> set[str]:
    return set(local_files(model, layer_range(LAYERS, rank, 2, SPLIT)))


def downloads(rank: Rank) -> list[dict[str, Any]]:
    return [e for e in rank.events if e["event"] == "progress" and e.get("stage") == "download"]


@dataclass
class PipelineRun:
    ranks: list[Rank]
    hubs: list[FakeHub]


def run_pipeline(homes: list[Path], hubs: list[FakeHub]) -> list[Rank]:
    """Two pipeline ranks decoding org/tiny, rank r with its own hub and cache."""
    jobs = ring_jobs(2, REPO, "pipeline", prompt=PROMPT, max_tokens=MAX_TOKENS, layer_split=SPLIT)
    started = [
        Ranks([job], env=hub_env(hub.url, home))
        for job, home, hub in zip(jobs, homes, hubs, strict=True)
    ]
    return [r for ranks in started for r in ranks.finish(RANK_TIMEOUT_S)]


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return [tmp_path_factory.mktemp(f"hf{r}") for r in range(2)]


@pytest.fixture(scope="module")
def first_run(tiny_dir: Path, homes: list[Path]) -> Iterator[PipelineRun]:
    with fake_hub({REPO: Repo(tiny_dir)}) as hub0, fake_hub({REPO: Repo(tiny_dir)}) as hub1:
        yield PipelineRun(run_pipeline(homes, [hub0, hub1]), [hub0, hub1])


def check_decoded(ranks: list[Rank], model: Path) -> None:
    for r, rank in enumerate(ranks):
        assert rank.proc.returncode == 0, (r, rank.events[-3:], rank.stderr[-5:])
        assert rank.stderr == [], rank.stderr  # events only: no progress bars, no warnings
    result = ranks[0].event("result")
    assert result is not None
    assert result["tokens"] == reference(model, PROMPT, MAX_TOKENS, 0).tokens


def test_pipeline_rank_downloads_metadata_and_only_its_own_layers(
    first_run: PipelineRun, tiny_dir: Path
) -> None:
    check_decoded(first_run.ranks, tiny_dir)
    for r, (rank, hub) in enumerate(zip(first_run.ranks, first_run.hubs, strict=True)):
        mine = own_files(tiny_dir, r)
        assert len(mine) < LAYERS + 1  # the split leaves some files to the other rank
        fetched = hub.fetched(REPO)
        assert sorted(fetched) == sorted(metadata_files(tiny_dir) | mine)  # each file once
        steps = downloads(rank)
        assert steps[0] == {"event": "progress", "rank": r, "stage": "download"} | {
            "done": 0, "total": 0, "file": "metadata"
        }  # fmt: skip
        weights = steps[1:]
        assert {s["file"] for s in weights} == mine
        assert weights[-1]["done"] == weights[-1]["total"] == len(mine)
        finished = {s["file"]: s for s in weights if s["bytes"] == s.get("size")}
        for name in mine:  # a closing event per file, with its full size
            assert finished[name]["bytes"] == (tiny_dir / name).stat().st_size
        loading = next(i for i, e in enumerate(rank.events) if e["event"] == "loading")
        assert rank.events.index(steps[-1]) < loading  # downloads come before loading


def test_second_load_is_served_from_the_cache(
    first_run: PipelineRun, tiny_dir: Path, homes: list[Path]
) -> None:
    assert all(r.proc.returncode == 0 for r in first_run.ranks)
    with fake_hub({REPO: Repo(tiny_dir)}) as hub0, fake_hub({REPO: Repo(tiny_dir)}) as hub1:
        ranks = run_pipeline(homes, [hub0, hub1])
        assert hub0.requests() == [] and hub1.requests() == []
    check_decoded(ranks, tiny_dir)
    assert all(downloads(rank) == [] for rank in ranks)


def test_launcher_shows_downloading_k_of_n(first_run: PipelineRun, tiny_dir: Path) -> None:
    from launcher.cli.launch import _LoadingDisplay

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    display = _LoadingDisplay(screen, 2)
    for r, rank in enumerate(first_run.ranks):
        for event in rank.events:
            display(r, event)
    shown = screen.getvalue()
    assert "rank 0: downloading  rank 1: starting" in shown  # the metadata, count unknown
    for r in range(2):
        n = len(own_files(tiny_dir, r))
        assert all(f"rank {r}: downloading {k}/{n}" in shown for k in range(n + 1))
    assert shown.endswith("rank 0: ready  rank 1: ready\n")


def run_one_rank(model: str, env: dict[str, str]) -> Rank:
    (job,) = ring_jobs(1, model, "tensor", prompt=PROMPT, max_tokens=2)
    (rank,) = Ranks([job], env=env).finish(RANK_TIMEOUT_S)
    return rank


def check_one_line_error(rank: Rank, message: str) -> None:
    assert rank.proc.returncode == 2, (rank.events[-3:], rank.stderr[-5:])
    error = rank.event("error")
    assert error is not None and error["kind"] == "input" and error["stage"] == "load"
    assert error["message"] == message
    assert rank.stderr == []  # no traceback, no retry warnings


def test_hub_down_is_one_line_and_fast(tmp_path: Path) -> None:
    url = dead_endpoint()
    (job,) = ring_jobs(1, REPO, "tensor", prompt=PROMPT, max_tokens=2)
    ranks = Ranks([job], env=hub_env(url, tmp_path / "hf"))
    # huggingface_hub alone would retry for ~25 s; the TCP check decides in well under that
    (rank,) = ranks.finish(timeout=15)
    check_one_line_error(
        rank,
        f"cannot download {REPO} on this host ({url} is unreachable): check the network or run "
        f"`hf download {REPO}` on it, or pass a local folder",
    )


def test_missing_weights_with_the_hub_down_name_the_gap(
    first_run: PipelineRun, tiny_dir: Path, homes: list[Path], tmp_path: Path
) -> None:
    """Rank 1's cache holds the metadata and its own files; a whole-model load needs more."""
    assert all(r.proc.returncode == 0 for r in first_run.ranks)
    home = tmp_path / "hf"
    shutil.copytree(homes[1], home, symlinks=True)
    url = dead_endpoint()
    rank = run_one_rank(REPO, hub_env(url, home))
    assert LAYERS + 1 - len(own_files(tiny_dir, 1)) == 1  # the file of rank 0's layer
    check_one_line_error(
        rank,
        f"cannot download {REPO} on this host ({url} is unreachable; 1 file not in the cache): "
        f"check the network or run `hf download {REPO}` on it, or pass a local folder",
    )


FETCH_SCRIPT = """
import json, sys
import cluster.files.hub_fetch as fetch
from cluster.load import local_files
from topology.errors import InputError

fetch.TICK_S = 0.05
steps = []
for repo in sys.argv[1:]:
    try:
        snap = fetch.fetch_metadata(repo, steps.append)
        files = local_files(snap.path, None, snap.weight_files())
        fetch.fetch_files(snap, files, steps.append)
        print(json.dumps({"files": files, "steps": [s.fields() for s in steps]}))
    except InputError as e:
        print(json.dumps({"error": str(e)}))
"""


def fetch_in_subprocess(env: dict[str, str], *repos: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", FETCH_SCRIPT, *repos],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_unknown_and_gated_repos_are_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    with fake_hub({"org/gated": Repo(tiny_dir, gated=True)}) as hub:
        missing, gated = fetch_in_subprocess(hub_env(hub.url, tmp_path), "org/nope", "org/gated")
    assert missing == {
        "error": "org/nope is not on the Hugging Face Hub (or is private: log in on this host "
        "with `hf auth login`)"
    }
    assert gated == {
        "error": "org/gated is gated on the Hugging Face Hub: accept its terms on the model page "
        "and log in on this host with `hf auth login`"
    }


def test_single_file_repo_reports_bytes_while_a_big_file_downloads(tmp_path: Path) -> None:
    """No index: the repo's one model.safetensors is fetched; slow bytes are reported on the way."""
    folder = tmp_path / "single"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    size = 24 * 1024 * 1024  # huggingface_hub hands bytes over 10 MB at a time
    (folder / "model.safetensors").write_bytes(b"\0" * size)
    with fake_hub({"org/single": Repo(folder, pause_s=0.3)}) as hub:
        (out,) = fetch_in_subprocess(hub_env(hub.url, tmp_path / "hf"), "org/single")
        assert sorted(hub.fetched("org/single")) == ["config.json", "model.safetensors"]
    assert out["files"] == ["model.safetensors"]
    first, *during, last = [s for s in out["steps"] if s["file"] == "model.safetensors"]
    assert first == {"done": 0, "total": 1, "file": "model.safetensors", "bytes": 0, "size": size}
    assert last == {"done": 1, "total": 1, "file": "model.safetensors", "bytes": size, "size": size}
    # a tick may land after the last byte but before the file is finalised: bytes == size
    assert during and all(0 < s["bytes"] <= size and s["done"] == 0 for s in during)


def launch_tokens(model: str, env: dict[str, str]) -> list[int]:
    done = subprocess.run(
        [MLX_CLUSTER, "launch", "--local", "2", "--strategy", "pipeline", "--model", model,
         "--prompt", "hi", "--max-tokens", "5", "--json"],
        capture_output=True, text=True, timeout=RANK_TIMEOUT_S, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tokens: list[int] = json.loads(done.stdout)["tokens"]
    return tokens


def test_launch_from_the_hub_gives_the_local_folders_tokens(tiny_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")}
    with fake_hub({REPO: Repo(tiny_dir)}) as hub:
        hub_tokens = launch_tokens(REPO, env | hub_env(hub.url, tmp_path / "hf"))
        assert sorted(set(hub.fetched(REPO))) == sorted(p.name for p in tiny_dir.iterdir())
    assert len(hub_tokens) == 5
    assert hub_tokens == launch_tokens(str(tiny_dir), env)


def test_no_hub_never_asks_the_hub(tiny_dir: Path, tmp_path: Path) -> None:
    """--no-hub: a repo not in the cache is one line, and the Hub hears nothing, not even
    from planning (which reads config.json)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")}
    with fake_hub({REPO: Repo(tiny_dir)}) as hub:
        done = subprocess.run(
            [MLX_CLUSTER, "launch", "--local", "1", "--model", REPO, "--prompt", "hi",
             "--max-tokens", "2", "--no-hub"],
            capture_output=True, text=True, timeout=RANK_TIMEOUT_S, cwd=ROOT,
            env=env | hub_env(hub.url, tmp_path / "hf"),
        )  # fmt: skip
        assert hub.requests() == []
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert REPO in line and "cache" in line
