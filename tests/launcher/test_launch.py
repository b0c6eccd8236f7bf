"""`mlx-cluster launch` end to end with real local ranks, its JSON contract, and bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from launch_helpers import LAUNCH_TIMEOUT_S, MLX_CLUSTER, PROMPT, ROOT, tiny_model

__all__ = ["tiny_model"]  # the fixture

JSON_FIELDS = {
    "text": str,
    "tokens": list,
    "prompt_tps": float,
    "generation_tps": float,
    "peak_memory_bytes": list,
    "strategy": str,
    "backend": str,
    "ranks": int,
}


def cli(*args: str, timeout_s: float = LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MLX_CLUSTER, *args], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
    )


def launch_json(model: Path, *args: str, max_tokens: int = 12) -> dict[str, Any]:
    done = cli(
        "launch", *args, "--model", str(model), "--prompt", PROMPT,
        "--max-tokens", str(max_tokens), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"--json must print exactly one line, got {lines}"
    out: dict[str, Any] = json.loads(lines[0])
    return out


@pytest.fixture(scope="module")
def single(tiny_model: Path) -> dict[str, Any]:
    return launch_json(tiny_model, "--local", "1")


def test_local_1_streams_text_then_a_summary_line(tiny_model: Path) -> None:
    done = cli(
        "launch", "--local", "1", "--model", str(tiny_model), "--prompt", PROMPT,
        "--max-tokens", "12",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    *text, summary = done.stdout.rstrip("\n").split("\n")
    assert "".join(text).strip(), "no generated text before the summary"
    assert summary.startswith("prompt: ")
    assert "generation: 12 tokens" in summary and "tok/s" in summary
    assert "peak memory: rank 0 " in summary
    assert done.stderr == ""


def test_json_line_has_every_contract_field(single: dict[str, Any]) -> None:
    for name, kind in JSON_FIELDS.items():
        assert isinstance(single[name], kind), f"{name}: {single.get(name)!r}"
    assert len(single["tokens"]) == 12 and all(isinstance(t, int) for t in single["tokens"])
    assert single["ranks"] == 1 and len(single["peak_memory_bytes"]) == 1
    assert single["prompt_tps"] > 0 and single["generation_tps"] > 0


@pytest.mark.parametrize("strategy", ["tensor", "pipeline"])
def test_local_2_gives_the_single_rank_tokens(
    tiny_model: Path, single: dict[str, Any], strategy: str
) -> None:
    two = launch_json(tiny_model, "--local", "2", "--strategy", strategy)
    assert two["tokens"] == single["tokens"]
    assert two["text"] == single["text"]
    assert (two["strategy"], two["backend"], two["ranks"]) == (strategy, "ring", 2)
    assert len(two["peak_memory_bytes"]) == 2
    assert all(0 < b < 1 << 40 for b in two["peak_memory_bytes"]), two["peak_memory_bytes"]


def test_tiny_qwen3_moe_over_3_uneven_ranks_gives_the_single_rank_text(tmp_path: Path) -> None:
    """A mixture-of-experts family from `tiny-model`, its 4 heads and 64-wide experts split 3
    ways by `launch` alone: the same greedy text as one process."""
    model = tmp_path / "qwen3_moe"
    made = cli("tiny-model", str(model), "--family", "qwen3_moe", "--layers", "2")
    assert made.returncode == 0, made.stderr
    one = launch_json(model, "--local", "1", max_tokens=8)
    three = launch_json(model, "--local", "3", "--strategy", "tensor", max_tokens=8)
    assert (three["strategy"], three["ranks"]) == ("tensor", 3)
    assert len(one["tokens"]) == 8
    assert three["tokens"] == one["tokens"]
    assert three["text"] == one["text"]


def test_plan_dir_from_the_plan_command(
    tiny_model: Path, single: dict[str, Any], tmp_path: Path
) -> None:
    planned = cli(
        "plan", "--local", "2", "--model", str(tiny_model), "--strategy", "pipeline",
        "--out", str(tmp_path / "p"),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    done = cli(
        "launch", "--plan", str(tmp_path / "p"), "--prompt", PROMPT, "--max-tokens", "12", "--json"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["strategy"], out["ranks"]) == ("pipeline", 2)
    assert out["tokens"] == single["tokens"]


def test_no_valid_plan_exits_1_with_the_reason(tmp_path: Path) -> None:
    # 2 query heads cannot go to 3 ranks, however unevenly.
    from cluster.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "h2", layers=2, hidden=32, heads=2, kv_heads=1)
    done = cli(
        "launch", "--local", "3", "--strategy", "tensor", "--model", str(model),
        "--prompt", PROMPT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "no valid plan" in done.stderr
    assert "needs at least 3 attention heads (the model has 2)" in done.stderr


def test_long_prompt_shows_prompt_progress_on_stderr_only(tiny_model: Path) -> None:
    """More than one prefill step (2048 tokens): rank 0's progress goes to stderr, one line per
    step; stdout is the same text (and --json the same line) as without it."""
    prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 100)  # ~2600 tokens
    args = ["launch", "--local", "2", "--model", str(tiny_model), "--prompt", prompt]
    text = cli(*args, "--max-tokens", "8")
    assert text.returncode == 0, text.stderr
    as_json = cli(*args, "--max-tokens", "8", "--json")
    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    total = result["prompt_tokens"]
    assert total > 2049, "the prompt must take more than one prefill step"
    for done in (text, as_json):
        lines = done.stderr.splitlines()
        assert lines == [f"prompt: 2048/{total} tokens", f"prompt: {total}/{total} tokens"], lines
    summary = text.stdout.rstrip("\n").rpartition("\n")[2]
    newline = "" if result["text"].endswith("\n") else "\n"  # launch ends the text's line
    assert text.stdout == result["text"] + newline + summary + "\n"
    assert re.match(rf"prompt: {total} tokens, [0-9.]+ tok/s \| generation: 8 tokens", summary)
    assert len(as_json.stdout.splitlines()) == 1


def _bad_inputs(model: Path, tmp: Path) -> list[list[str]]:
    m = ["--model", str(model), "--prompt", PROMPT]
    (tmp / "empty").mkdir()
    return [
        ["--local", "0", *m],
        ["--local", "2", "--model", str(tmp / "missing"), "--prompt", PROMPT],
        ["--local", "1", "--model", str(tmp / "empty"), "--prompt", PROMPT],
        ["--local", "1", *m, "--max-tokens", "0"],
        ["--local", "1", *m, "--top-p", "1.5"],
        ["--local", "1", *m, "--temp", "-1"],
        ["--local", "1", *m, "--rank-timeout", "0"],
        ["--local", "1", *m, "--rank-timeout", "nan"],  # no deadline could ever fire
        ["--local", "1", *m, "--strategy", "diagonal"],
        ["--local", "2", *m, "--backend", "jaccl"],
        ["--local", "1", "--plan", str(tmp), *m],
        m,
        ["--local", "1", "--prompt", PROMPT],
        [str(tmp / "nope.yaml"), *m],
        ["--plan", str(tmp / "empty"), "--prompt", PROMPT],
    ]


def test_bad_input_is_one_line_and_exit_2(tiny_model: Path, tmp_path: Path) -> None:
    for args in _bad_inputs(tiny_model, tmp_path):
        done = cli("launch", *args, timeout_s=60)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mlx-cluster: error:"), (args, lines)
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_demo_answers_with_the_real_model_over_2_ranks(tmp_path: Path) -> None:
    """The README's first command: SmolLM2 (installed by scripts/setup; 9 heads / 3 KV heads,
    split unevenly) answers a real question over 2 ranks, token for token as one process."""
    env = {**os.environ, "MLX_CLUSTER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [MLX_CLUSTER, "demo"],
        capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S * 3, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "SmolLM2-135M-Instruct, real weights" in done.stdout
    assert "Paris" in done.stdout
    assert "tensor over 2 rank(s)" in done.stdout and "tok/s" in done.stdout
    assert "match: the 2 ranks produced the single process's" in done.stdout


def test_demo_tiny_matches_the_single_process(tmp_path: Path) -> None:
    env = {**os.environ, "MLX_CLUSTER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [MLX_CLUSTER, "demo", "--tiny", "--max-tokens", "8"],
        capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S * 2, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cache" / "demo-model" / "config.json").is_file()
    assert "random weights, --tiny" in done.stdout
    assert "tensor over 2 rank(s)" in done.stdout and "tok/s" in done.stdout
    assert "match: the 2 ranks produced the single process's 8 tokens exactly" in done.stdout


def test_plan_dir_with_shell_characters_in_ssh_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    planned = cli(
        "plan", "--local", "2", "--model", str(tiny_model), "--out", str(tmp_path / "p"),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    marker = tmp_path / "executed"
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    plan["local"] = False  # as if planned for two Macs
    (tmp_path / "p" / "plan.json").write_text(json.dumps(plan))
    hostfile = json.loads((tmp_path / "p" / "hostfile.json").read_text())
    hostfile["hosts"][1]["ssh"] = f"b;touch {marker}"
    (tmp_path / "p" / "hostfile.json").write_text(json.dumps(hostfile))
    done = cli("launch", "--plan", str(tmp_path / "p"), "--prompt", PROMPT)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "hostfile.json" in done.stderr
    assert not marker.exists()
