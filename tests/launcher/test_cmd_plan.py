"""`mlx-cluster plan` as a user runs it: the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import synth
from mlx._distributed_utils.common import Hostfile
from paths import FIXTURES, MLX_CLUSTER

from topology.planning.plan import Plan

CLI = MLX_CLUSTER
MODELS = FIXTURES / "models"
LLAMA = str(MODELS / "llama-3.3-70b-instruct-bf16")
DEEPSEEK = str(MODELS / "deepseek-v3-4bit")


def run(*args: str | Path, hf_home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    return subprocess.run(
        [str(CLI), "plan", *map(str, args)],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def as_json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def mesh4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth.mesh(4).write(tmp_path_factory.mktemp("mesh4"))


@pytest.fixture(scope="module")
def mesh3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth.mesh(3).write(tmp_path_factory.mktemp("mesh3"))


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama's config with 2 attention heads: tensor parallel cannot split it 3 ways."""
    config = json.loads((Path(LLAMA) / "config.json").read_text())
    d = tmp_path_factory.mktemp("two-heads")
    (d / "config.json").write_text(
        json.dumps({**config, "num_attention_heads": 2, "num_key_value_heads": 2})
    )
    return d


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cluster.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", family="qwen3", layers=4)


def test_json_plan_on_a_snapshot(mesh4: Path) -> None:
    out = run("--snapshot", mesh4, "--model", LLAMA, "--json")
    assert out.returncode == 0, out.stderr
    plan = as_json(out)
    assert (plan["strategy"], plan["backend"]) == ("tensor", "jaccl")
    assert [r["host"] for r in plan["ranks"]] == synth.names(4)
    assert all(r["layers"] == [0, 80] for r in plan["ranks"])
    assert plan["predicted_decode_tok_s"] > 0 and plan["problems"] == []
    assert plan["reason"].startswith("tensor over 4 is fastest")


def test_readable_plan_shows_table_reason_and_problems(mesh3: Path, two_heads: Path) -> None:
    out = run("--snapshot", mesh3, "--model", LLAMA)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Plan: tensor parallel, 3 rank(s)" in text
    assert "Why: tensor over 3 is fastest: " in text and " for pipeline" in text
    assert "rank  host" in text and "needed" in text and "usable" in text
    assert "share of each layer" in text and "read/token" in text and "step" in text
    # 64 heads, 8 KV heads over 3: runs of heads across KV rows, the KV heads cut replicated
    assert " heads in 2 calls, " in text and " heads in 3 calls, " in text
    assert " KV (replicated), mlp " in text
    assert "shares follow each host's memory bandwidth" in text
    assert "Problems:" not in text and "tp_" not in text
    assert "Predicted decode:" in text
    few = run("--snapshot", mesh3, "--model", two_heads)
    assert few.returncode == 0, few.stderr
    text = few.stdout
    assert "Plan: pipeline parallel, 3 rank(s)" in text
    assert (
        "Why: tensor over 3 would need at least 3 attention heads (the model has 2); "
        "pipeline over 3 instead" in text
    )
    assert "share of each layer" not in text
    assert "warning tp_cannot_split" in text
    assert "fix: Use at most 2 hosts for tensor parallel, or `--strategy pipeline`." in text


def test_out_writes_plan_and_a_hostfile_mlx_parses(mesh3: Path, tmp_path: Path) -> None:
    out = run("--snapshot", mesh3, "--model", LLAMA, "--out", tmp_path / "p", "--json")
    assert out.returncode == 0, out.stderr
    written = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert written == as_json(out)
    plan = Plan.from_json(written)
    assert plan.strategy == "tensor" and plan.layer_split is None
    # every rank reads its own share back from plan.json
    assert [r.tensor_share for r in plan.ranks] == [r["tensor_share"] for r in written["ranks"]]
    assert sum(r["heads"] for r in written["ranks"]) == 64
    hostfile = Hostfile.from_file(tmp_path / "p" / "hostfile.json")
    assert hostfile.backend == "jaccl"
    assert [h.ssh_hostname for h in hostfile.hosts] == [r.ssh for r in plan.ranks]
    assert hostfile.hosts[0].ips == [plan.ranks[0].ip]
    piped = run(
        "--snapshot", mesh3, "--model", LLAMA, "--strategy", "pipeline", "--out", tmp_path / "q"
    )
    assert piped.returncode == 0, piped.stderr
    plan = Plan.from_json(json.loads((tmp_path / "q" / "plan.json").read_text()))
    assert plan.layer_split is not None and sum(plan.layer_split) == 80
    assert all(r.tensor_share is None for r in plan.ranks)


def test_no_valid_plan_exits_1_and_says_why(tmp_path: Path) -> None:
    snap = synth.cluster(1, memory_gb=256).write(tmp_path / "one")
    earlier = run("--snapshot", snap, "--model", LLAMA, "--out", tmp_path / "o")
    assert earlier.returncode == 0 and (tmp_path / "o" / "plan.json").exists()
    # no valid plan now: the earlier plan's files go, so `launch --plan` cannot run them
    out = run("--snapshot", snap, "--model", DEEPSEEK, "--json", "--out", tmp_path / "o")
    assert out.returncode == 1, out.stderr
    plan = as_json(out)
    assert plan["ranks"] == [] and plan["predicted_decode_tok_s"] is None
    assert [p["code"] for p in plan["problems"]] == ["model_does_not_fit"]
    assert not any((tmp_path / "o" / f).exists() for f in ("plan.json", "hostfile.json"))
    text = run("--snapshot", snap, "--model", DEEPSEEK)
    assert text.returncode == 1 and "No valid plan." in text.stdout
    assert "error model_does_not_fit" in text.stdout


def test_forced_tensor_over_3_splits_unevenly(mesh3: Path) -> None:
    out = run("--snapshot", mesh3, "--model", LLAMA, "--strategy", "tensor", "--json")
    assert out.returncode == 0, out.stderr
    plan = as_json(out)
    assert plan["strategy"] == "tensor" and plan["problems"] == []
    assert plan["reason"].startswith("tensor over 3 as requested")


def test_forced_tensor_over_more_ranks_than_heads_is_refused(mesh3: Path, two_heads: Path) -> None:
    out = run("--snapshot", mesh3, "--model", two_heads, "--strategy", "tensor", "--json")
    assert out.returncode == 1, out.stderr
    plan = as_json(out)
    assert plan["ranks"] == [] and [p["code"] for p in plan["problems"]] == ["tp_cannot_split"]
    [problem] = plan["problems"]
    assert problem["severity"] == "error"
    assert problem["message"] == (
        "tensor parallel over 3 ranks needs at least 3 attention heads (the model has 2)"
    )
    assert "at most 2 hosts" in problem["fix"]


def test_local_ranks_with_a_real_tiny_model(tiny: Path, tmp_path: Path) -> None:
    out = run("--local", "2", "--model", tiny, "--json", "--out", tmp_path / "p")
    assert out.returncode == 0, out.stderr
    plan = as_json(out)
    assert plan["local"] and plan["backend"] == "ring" and len(plan["ranks"]) == 2
    assert {r["ip"] for r in plan["ranks"]} == {"127.0.0.1"}
    assert plan["model"] == str(tiny.resolve())
    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    assert plan["model_info"]["weight_bytes"] == index["metadata"]["total_size"]
    hostfile = json.loads((tmp_path / "p" / "hostfile.json").read_text())
    assert [h["ssh"] for h in hostfile["hosts"]] == ["127.0.0.1", "127.0.0.1"]
    # prefill is predicted for 1,024 tokens unless told otherwise; 4× the prompt, ≥ 4× the wait
    assert plan["prompt_tokens"] == 1024 and plan["predicted_ttft_s"] > 0
    longer = as_json(run("--local", "2", "--model", tiny, "--json", "--prompt-tokens", "4096"))
    assert longer["prompt_tokens"] == 4096
    assert longer["predicted_ttft_s"] >= 4 * plan["predicted_ttft_s"]
    assert longer["predicted_decode_tok_s"] == plan["predicted_decode_tok_s"]


def _tiny(tmp_path: Path, family: str, **shape: Any) -> Path:
    from cluster.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path / family, family=family, **shape)


def test_gpt_oss_is_refused_as_pipeline_stages(tmp_path: Path) -> None:
    """mlx-lm has no pipeline() for gpt_oss: plan says so in one line, before any rank loads."""
    model = _tiny(tmp_path, "gpt_oss", layers=2)
    why = "neither mlx-lm nor mlx-cluster runs gpt_oss as pipeline stages"
    out = run("--local", "2", "--model", model, "--strategy", "pipeline", "--json")
    assert out.returncode == 1, out.stderr
    assert out.stderr == ""
    plan = as_json(out)
    assert plan["ranks"] == [] and plan["reason"] == f"no valid plan: {why}"
    assert [(p["code"], p["message"]) for p in plan["problems"]] == [("pipeline_unsupported", why)]
    text = run("--local", "2", "--model", model, "--strategy", "pipeline")
    assert text.returncode == 1 and text.stderr == ""
    assert f"Why: no valid plan: {why}\n" in text.stdout


@pytest.mark.parametrize(
    ("family", "width", "fix"),
    [
        # 2 groups of 32 columns split over 2; gpt_oss cannot pipeline, so no pipeline hint
        ("gpt_oss", 64, "Use at most 2 hosts for tensor parallel."),
        ("qwen3_moe", 64, "Use at most 2 hosts for tensor parallel, or `--strategy pipeline`."),
        # one group: no split at all, and no pipeline either
        ("gpt_oss", 32, "Run it on one host: tensor parallel cannot split it over 2 ranks."),
    ],
    ids=["gpt_oss", "qwen3_moe", "gpt_oss_one_group"],
)
def test_width_that_cannot_split_names_the_most_ranks_that_can(
    tmp_path: Path, family: str, width: int, fix: str
) -> None:
    model = _tiny(tmp_path, family, layers=4, hidden=128, moe_intermediate=width, quantize_bits=4)
    out = run("--local", "3", "--model", model, "--strategy", "tensor", "--json")
    assert out.returncode == 1, out.stderr
    [problem] = [p for p in as_json(out)["problems"] if p["code"] == "tp_cannot_split"]
    assert problem["severity"] == "error"
    assert problem["message"] == (
        f"tensor parallel over 3 ranks needs expert width {width} in at least 3 pieces of 32 "
        "columns"
    )
    assert problem["fix"] == fix


def _cache(hf_home: Path, repo: str, files: dict[str, Path]) -> None:
    """Lay files out the way huggingface_hub's cache does (refs/main -> snapshots/<commit>)."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    (root / "snapshots" / commit).mkdir(parents=True)
    for name, src in files.items():
        shutil.copy(src, root / "snapshots" / commit / name)


def test_hub_repo_id_is_read_from_the_cache_offline(mesh4: Path, tmp_path: Path) -> None:
    _cache(
        tmp_path / "hf", "mlx-community/Llama-3.3-70B", {"config.json": Path(LLAMA) / "config.json"}
    )
    out = run(
        "--snapshot",
        mesh4,
        "--model",
        "mlx-community/Llama-3.3-70B",
        "--json",
        hf_home=tmp_path / "hf",
    )
    assert out.returncode == 0, out.stderr
    assert as_json(out)["model"] == "mlx-community/Llama-3.3-70B"


def _bad_config(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text(text)
    return d


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--local", "0", "--model", LLAMA], "--local must be at least 1"),
        (["--local", "-3", "--model", LLAMA], "--local must be at least 1"),
        (["--local", "2", "--model", "{tmp}/nowhere"], "no such directory"),
        (["--local", "2", "--model", "{tmp}"], "no config.json in"),
        (
            ["--local", "2", "--model", LLAMA, "--strategy", "zigzag"],
            "Invalid value for '--strategy'",
        ),
        (
            ["--local", "2", "--model", LLAMA, "--backend", "jaccl"],
            "--local runs ranks over the ring",
        ),
        (["--local", "2", "--model", LLAMA, "--context", "0"], "--context must be at least 1"),
        (
            ["--local", "2", "--model", LLAMA, "--prompt-tokens", "0"],
            "--prompt-tokens must be at least 1",
        ),
        (["--local", "2"], "Missing option '--model'"),
        (["--model", LLAMA], "give exactly one of CLUSTER.yaml, --snapshot DIR or --local N"),
        (["--local", "1", "--snapshot", "{tmp}", "--model", LLAMA], "give exactly one of"),
        (
            ["--snapshot", "{tmp}/missing", "--model", LLAMA],
            "--snapshot {tmp}/missing: no such directory",
        ),
        (["{tmp}/cluster.yaml", "--model", LLAMA], "no such cluster file"),
        (["--local", "1", "--model", LLAMA, "--out", "{tmp}/a/b"], "its parent directory"),
        (
            ["--local", "1", "--model", "org/not-cached"],
            "'org/not-cached' is not in the Hugging Face cache and the Hub is off",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    out = run(*[a.replace("{tmp}", str(tmp_path)) for a in args], hf_home=tmp_path / "hf")
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert words.replace("{tmp}", str(tmp_path)) in lines[0]
    assert out.stdout == ""


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "config.json: not valid JSON (line 1"),
        (
            '{"model_type": "llama", "num_hidden_layers": "eighty"}',
            "config.json: num_hidden_layers: must be a positive integer",
        ),
        ('{"model_type": "llama", "num_hidden_layers": 2}', "config.json: hidden_size: missing"),
        ("[1, 2]", "config.json: must be a JSON object"),
    ],
)
def test_malformed_config_is_one_line_exit_2(tmp_path: Path, text: str, words: str) -> None:
    out = run("--local", "1", "--model", _bad_config(tmp_path, text))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and str(tmp_path / "bad") in lines[0]


def test_cluster_file_is_probed_live(tiny: Path, tmp_path: Path) -> None:
    """localhost is probed for real (this Linux box is not a Mac: ring only, memory unchecked)."""
    cluster = tmp_path / "one.yaml"
    cluster.write_text("hosts:\n  - name: here\n    ssh: localhost\n    ips: [127.0.0.1]\n")
    out = run(cluster, "--model", tiny, "--json", "--out", tmp_path / "p")
    assert out.returncode == 0, out.stderr
    plan = as_json(out)
    assert [r["host"] for r in plan["ranks"]] == ["here"] and plan["backend"] == "ring"
    assert [p["code"] for p in plan["problems"]] == ["not_a_mac"]
    assert any("not checked" in a for a in plan["assumptions"])
    hostfile = Hostfile.from_file(tmp_path / "p" / "hostfile.json")
    assert [(h.ssh_hostname, h.ips) for h in hostfile.hosts] == [("localhost", ["127.0.0.1"])]
    # `launch --plan` reads ssh options and per-host python from the copied cluster file
    assert (tmp_path / "p" / "cluster.yaml").read_bytes() == cluster.read_bytes()


def test_unreachable_hub_fails_fast_in_one_line(tmp_path: Path) -> None:
    """Online mode, but the Hub endpoint refuses connections: no retry noise, one line, exit 2."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run(
        [str(CLI), "plan", "--local", "1", "--model", "org/somewhere"],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "mlx-cluster: error: 'org/somewhere' is not in the Hugging Face cache and cannot reach "
        "the Hugging Face Hub: download it first with `hf download org/somewhere --include "
        "'*.json'` or pass a local directory"
    ]
