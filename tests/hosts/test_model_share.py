"""Only h0 has the model: `launch` run on h0 gets every other host the files its shard needs.

Three emulated hosts on a Thunderbolt-like mesh, each with its own ~/.cache and its own view of
the models folder (a private mount namespace per host), and no reachable Hub: a model that
exists only on h0, as a folder or as a repo in h0's Hugging Face cache, must still give one
process's tokens under pipeline x3 and tensor x3, copying each file once (launcher/share/).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_cache import write_hub_cache

from cluster.files.model_files import is_metadata
from cluster.load import local_files
from cluster.pipeline_stage import layer_range
from cluster.tiny_model import write_tiny_model
from hosts.launching import CLI, cli, link_bytes, rank_pids, reference_tokens, wait_until_empty
from hosts.netns import VENV_PYTHON, EmulatedHosts, require

PROMPT = "Tell me about clusters"
MAX_TOKENS = 8
LAYERS = 6
SHAPE = {"layers": LAYERS, "hidden": 192, "heads": 6, "kv_heads": 3}  # tensor/pipeline x3
LINUX = {"wired_limit_gb": 4}
CACHE = Path("/root/.cache")  # where a rank's host keeps mlx-cluster's and the Hub's caches
REPO = "org/tiny3"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedHosts]:
    require()
    models = tmp_path_factory.mktemp("models")  # each host sees its own (empty) folder here
    # A Hub that refuses at once: every host is offline, as the issue asks.
    offline = {"HF_ENDPOINT": "http://127.0.0.1:9"}
    with EmulatedHosts(3, "mesh", private=[CACHE, models], session_env=offline) as built:
        built.models = models  # type: ignore[attr-defined]
        yield built


def _models(hosts: EmulatedHosts) -> Path:
    path: Path = hosts.models  # type: ignore[attr-defined]
    return path


def _cluster(hosts: EmulatedHosts, tmp_path: Path) -> Path:
    return hosts.cluster_yaml(tmp_path / "cluster.yaml", host_keys=LINUX, backend="ring")


def _launch_argv(hosts: EmulatedHosts, cluster: Path, model: str, strategy: str) -> list[str]:
    argv = [str(CLI), "launch", str(cluster), "--json", "--model", model, "--prompt", PROMPT,
            "--max-tokens", str(MAX_TOKENS), "--strategy", strategy, "--no-hub"]  # fmt: skip
    return hosts.in_host(0, argv)


def _env() -> dict[str, str]:
    """The launcher as a user on h0 runs it: h0's own caches, the Hub unreachable."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLX_CLUSTER_CACHE", "HF_HOME")}
    return {**env, "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONUNBUFFERED": "1"}


def launch(hosts: EmulatedHosts, cluster: Path, model: str, strategy: str) -> dict[str, Any]:
    done = subprocess.run(_launch_argv(hosts, cluster, model, strategy), capture_output=True,
                          text=True, timeout=300, env=_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    wait_until_empty(hosts, 10, time.monotonic())
    return result


def copies(hosts: EmulatedHosts, i: int) -> dict[str, Path]:
    """The model files host i holds in its mlx-cluster cache, by name (any model folder)."""
    root = hosts.private_path(i, CACHE) / "mlx-cluster" / "models"
    found = root.glob("*/*") if root.is_dir() else iter(())
    return {p.name: p for p in found if not p.name.endswith(".lock")}


def by_host(result: dict[str, Any]) -> dict[int, int]:
    """Host index -> its rank in this launch."""
    return {int(name[1:]): rank for rank, name in enumerate(result["hosts"])}


def shard_files(model: Path, strategy: str, rank: int) -> set[str]:
    """What a rank loads: the metadata, and its layers' files (pipeline) or all (tensor)."""
    meta = {p.name for p in model.iterdir() if is_metadata(p.name)}
    layers = layer_range(LAYERS, rank, 3, None) if strategy == "pipeline" else None
    return meta | set(local_files(model, layers))


def test_a_folder_only_h0_has_reaches_each_host_once(hosts: EmulatedHosts, tmp_path: Path) -> None:
    model = write_tiny_model(hosts.private_path(0, _models(hosts)) / "x3", **SHAPE)
    expected = reference_tokens(model, PROMPT, MAX_TOKENS)
    cluster = _cluster(hosts, tmp_path)
    seen = str(_models(hosts) / "x3")  # the path on h0; h1 and h2 have nothing there
    assert not (hosts.private_path(1, _models(hosts)) / "x3").exists()

    # Pipeline first: each host copies exactly its own layers' files, over its cable to h0.
    sent = {dev: link_bytes(hosts, 0, dev) for dev in ("tb1", "tb2", "lan0")}
    result = launch(hosts, cluster, seen, "pipeline")
    assert result["tokens"] == expected
    ranks = by_host(result)
    assert result["copied"][ranks[0]]["files"] == 0  # h0 loads its own folder
    for i in (1, 2):
        assert set(copies(hosts, i)) == shard_files(model, "pipeline", ranks[i])
        assert result["copied"][ranks[i]]["files"] == len(copies(hosts, i))
        copied = result["copied"][ranks[i]]["bytes"]
        assert link_bytes(hosts, 0, f"tb{i}") - sent[f"tb{i}"] >= copied
    lan = link_bytes(hosts, 0, "lan0") - sent["lan0"]  # ssh and the ranks' events only
    assert lan < min(result["copied"][ranks[i]]["bytes"] for i in (1, 2)) / 2
    assert copies(hosts, 0) == {}

    # Tensor next: every rank loads every file; each host copies only what it still lacks.
    had = {i: set(copies(hosts, i)) for i in (1, 2)}
    result = launch(hosts, cluster, seen, "tensor")
    assert result["tokens"] == expected
    ranks = by_host(result)
    for i in (1, 2):
        assert set(copies(hosts, i)) == shard_files(model, "tensor", 0)
        assert result["copied"][ranks[i]]["files"] == len(copies(hosts, i)) - len(had[i])

    # A second launch transfers nothing.
    result = launch(hosts, cluster, seen, "tensor")
    assert result["tokens"] == expected
    assert [c["bytes"] for c in result["copied"]] == [0, 0, 0]

    # A file changed on h1 is found out and copied again; its bytes are the original's.
    victim = copies(hosts, 1)[sorted(local_files(model, None))[1]]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    result = launch(hosts, cluster, seen, "tensor")
    assert result["tokens"] == expected
    assert result["copied"][by_host(result)[1]]["files"] == 1
    assert victim.read_bytes() == (model / victim.name).read_bytes()


def test_a_repo_in_h0s_hub_cache_reaches_each_host(hosts: EmulatedHosts, tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny3", seed=3, **SHAPE)
    expected = reference_tokens(model, PROMPT, MAX_TOKENS)
    write_hub_cache(hosts.private_path(0, CACHE) / "huggingface", REPO, model)
    cluster = _cluster(hosts, tmp_path)
    before = {i: set(copies(hosts, i)) for i in (1, 2)}

    result = launch(hosts, cluster, REPO, "pipeline")
    assert result["tokens"] == expected
    ranks = by_host(result)
    for i in (1, 2):
        folder = next((hosts.private_path(i, CACHE) / "mlx-cluster" / "models").glob("org--*"))
        got = {p.name for p in folder.iterdir() if not p.name.endswith(".lock")}
        assert got == shard_files(model, "pipeline", ranks[i])
        assert not (hosts.private_path(i, CACHE) / "huggingface").exists()
    result = launch(hosts, cluster, REPO, "tensor")
    assert result["tokens"] == expected
    assert all(set(copies(hosts, i)) >= before[i] for i in (1, 2))


def _listening_urls(hosts: EmulatedHosts, pid: int) -> list[str]:
    """The launcher's file servers: its listening TCP sockets on h0."""
    out = hosts.run(0, ["ss", "-ltnpH"], check=True).stdout
    return [f"http://{line.split()[3]}" for line in out.splitlines() if f"pid={pid}," in line]


_GET = """
import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers=dict(h.split(": ", 1) for h in sys.argv[2:]))
try:
    print(urllib.request.urlopen(req, timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except urllib.error.URLError:
    print(0)  # no route from this host
"""


def _status(hosts: EmulatedHosts, url: str, *headers: str) -> int:
    """The answer to a GET from whichever of h1 and h2 has a route to `url`."""
    for i in (1, 2):
        done = hosts.run(i, [str(VENV_PYTHON), "-c", _GET, url, *headers], check=True)
        if status := int(done.stdout.strip()):
            return status
    raise AssertionError(f"{url} is reachable from no host")


def _partial(hosts: EmulatedHosts, i: int) -> int:
    """Bytes host i holds in unfinished copies."""
    total = 0
    for path in copies(hosts, i).values():
        if path.suffix == ".part":
            with contextlib.suppress(FileNotFoundError):  # just finished
                total += path.stat().st_size
    return total


def test_a_cut_copy_resumes_and_strangers_are_refused(hosts: EmulatedHosts, tmp_path: Path) -> None:
    # Layers of ~4 MB: a copy writes in 2 MiB steps, so a cut one keeps some.
    shape = {**SHAPE, "hidden": 384}
    model = write_tiny_model(hosts.private_path(0, _models(hosts)) / "slow", seed=5, **shape)
    expected = reference_tokens(model, PROMPT, MAX_TOKENS)
    cluster = _cluster(hosts, tmp_path)
    for dev in ("tb1", "tb2"):  # h0's cables at 8 Mbit/s: the copy takes a while
        hosts.run(0, ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "8mbit",
                      "burst", "32kbit", "latency", "400ms"], check=True)  # fmt: skip
    seen = str(_models(hosts) / "slow")
    run = subprocess.Popen(_launch_argv(hosts, cluster, seen, "tensor"), env=_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while _partial(hosts, 1) < 2 << 20:
            assert time.monotonic() < deadline and run.poll() is None, "no copy under way"
            time.sleep(0.1)
        urls = _listening_urls(hosts, run.pid)
        assert urls
        for url in urls:  # without the token, or with another, nothing is served
            assert _status(hosts, f"{url}/files/config.json") == 401
            assert _status(hosts, f"{url}/files/config.json",
                                   "Authorization: Bearer not-the-token") == 401  # fmt: skip
        for pid in rank_pids(hosts, 1):  # the copy is cut: h1's rank dies mid-file
            os.kill(pid, signal.SIGKILL)
        assert run.wait(60) == 1
        kept = _partial(hosts, 1)
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=30)
        for dev in ("tb1", "tb2"):
            hosts.run(0, ["tc", "qdisc", "del", "dev", dev, "root"])
    wait_until_empty(hosts, 20, time.monotonic())
    assert kept > 0

    result = launch(hosts, cluster, seen, "tensor")
    assert result["tokens"] == expected
    assert result["copied"][by_host(result)[1]]["resumed"] >= kept
    assert all(not p.name.endswith(".part") for p in copies(hosts, 1).values())


def test_serve_gets_the_model_to_its_ranks_too(hosts: EmulatedHosts, tmp_path: Path) -> None:
    from mlx_lm.utils import load_tokenizer

    model = write_tiny_model(hosts.private_path(0, _models(hosts)) / "served", seed=7, **SHAPE)
    want = load_tokenizer(model).decode(reference_tokens(model, PROMPT, MAX_TOKENS))
    cluster = _cluster(hosts, tmp_path)
    argv = [str(CLI), "serve", str(cluster), "--model", str(_models(hosts) / "served"),
            "--strategy", "tensor", "--no-hub", "--host", hosts[0].ip, "--port", "0"]  # fmt: skip
    serve = subprocess.Popen(hosts.in_host(0, argv), env=_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert serve.stdout is not None
        ready = serve.stdout.readline()  # one line once every rank has loaded
        found = re.search(r"at (http://\S+/v1) ", ready)
        assert found, (ready, serve.poll())
        body = {"model": "served", "max_tokens": MAX_TOKENS, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPT}]}  # fmt: skip
        request = urllib.request.Request(
            f"{found.group(1)}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        assert answer["choices"][0]["message"]["content"] == want
        for i in (1, 2):
            folder = next((hosts.private_path(i, CACHE) / "mlx-cluster/models").glob("served-*"))
            got = {p.name for p in folder.iterdir() if not p.name.endswith(".lock")}
            assert got == shard_files(model, "tensor", 0)
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.communicate()
    wait_until_empty(hosts, 20, time.monotonic())


def test_a_repo_the_launcher_lacks_comes_from_the_hosts_that_hold_it(
    hosts: EmulatedHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launching machine (not a host) has only what planning read; h1's Hub cache holds
    the first layers, h2's the last, h0's nothing: every host still loads every file."""
    model = write_tiny_model(tmp_path / "split", seed=11, **SHAPE)
    expected = reference_tokens(model, PROMPT, MAX_TOKENS)
    repo = "org/split"
    meta = {p.name for p in model.iterdir() if is_metadata(p.name)}
    first = set(local_files(model, range(0, 3)))
    last = set(local_files(model, range(3, LAYERS))) - first
    write_hub_cache(tmp_path / "hf", repo, model, only={"config.json", INDEX})
    write_hub_cache(hosts.private_path(1, CACHE) / "huggingface", repo, model, meta | first)
    write_hub_cache(hosts.private_path(2, CACHE) / "huggingface", repo, model, meta | last)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("MLX_CLUSTER_CACHE", str(tmp_path / "cache"))
    cluster = _cluster(hosts, tmp_path)
    done = cli("launch", str(cluster), "--json", "--model", repo, "--prompt", PROMPT,
               "--max-tokens", str(MAX_TOKENS), "--strategy", "tensor", "--no-hub")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tokens"] == expected
    every = shard_files(model, "tensor", 0)
    # h0 had nothing: it holds every file now, from h1 and h2 (neither has them all).
    assert set(_repo_copies(hosts, 0)) == every
    assert set(_repo_copies(hosts, 1)) == every - meta - first
    assert set(_repo_copies(hosts, 2)) == every - meta - last
    wait_until_empty(hosts, 10, time.monotonic())


def _repo_copies(hosts: EmulatedHosts, i: int) -> list[str]:
    root = hosts.private_path(i, CACHE) / "mlx-cluster" / "models"
    return [p.name for p in root.glob("org--split-*/*") if not p.name.endswith(".lock")]
