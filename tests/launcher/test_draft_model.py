"""`--draft-model`: rank 0 drafts with a second model and hands the drafts to the other ranks;
the output stays exactly `--speculative off`'s, in `launch` (pipeline and tensor) and in `serve`
(a batch of greedy and seeded requests through the official `openai` client). A draft model of
another vocabulary, a missing one, or one with `--speculative off` is one line, exit 2, before
anything launches."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from launch_helpers import MLX_CLUSTER, launched, tiny_model
from serve_helpers import Server, serving

from cluster.tiny_model import write_tiny_model

__all__ = ["tiny_model"]  # the fixture
PROMPT = "the sea and the mountains, the sea and the"


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another random model of the same vocabulary: its drafts are mostly rejected."""
    return write_tiny_model(tmp_path_factory.mktemp("draft") / "other", layers=2, seed=7)


def _launch(*args: str) -> dict[str, Any]:
    with launched("--local", "2", "--prompt", PROMPT, "--max-tokens", "40", "--json", *args) as run:
        assert run.wait() == 0, run.stderr
        return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def test_launch_with_a_draft_model_gives_the_plain_tokens(
    tiny_model: Path, other_draft: Path
) -> None:
    for strategy in ("pipeline", "tensor"):
        model = ("--model", str(tiny_model), "--strategy", strategy)
        plain = _launch(*model, "--speculative", "off")
        same = _launch(*model, "--draft-model", str(tiny_model))
        other = _launch(*model, "--draft-model", str(other_draft))
        assert same["tokens"] == plain["tokens"] and other["tokens"] == plain["tokens"], strategy
        # The target as its own draft: every drafted token is the target's own choice.
        assert same["accepted_tokens"] == same["drafted_tokens"] > len(plain["tokens"]) // 2
        assert other["accepted_tokens"] < other["drafted_tokens"]
    # What launch prints for people: the same counts, and the tokens each check gave.
    with launched("--local", "2", "--prompt", PROMPT, "--max-tokens", "40", *model,
                  "--draft-model", str(tiny_model)) as run:  # fmt: skip
        assert run.wait() == 0, run.stderr
    per_check = (same["accepted_tokens"] + same["draft_checks"]) / same["draft_checks"]
    printed = (
        f"speculative: {same['accepted_tokens']}/{same['drafted_tokens']} drafted tokens "
        f"accepted, {per_check:.2f} tokens per checking step"
    )
    assert printed in run.stderr + run.stdout, run.stderr


def _ask(server: Server, i: int) -> str:
    out = server.client().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"{PROMPT} {i}"}],
        max_tokens=24 + 4 * i,
        temperature=0.9 if i % 2 else 0.0,  # seeded draws and greedy ones in one batch
        seed=100 + i,
    )
    return out.choices[0].message.content or ""


def test_serve_with_a_draft_model_batches_the_plain_answers(tiny_model: Path) -> None:
    with (
        serving("--local", "2", "--model", str(tiny_model), "--draft-model", str(tiny_model)) as on,
        serving("--local", "1", "--model", str(tiny_model), "--speculative", "off") as off,
    ):
        on.wait_ready()
        off.wait_ready()
        with ThreadPoolExecutor(6) as pool:  # at once: one batch on the ranks
            got = list(pool.map(lambda i: _ask(on, i), range(6)))
        want = [_ask(off, i) for i in range(6)]
        assert got == want
        with urllib.request.urlopen(f"http://127.0.0.1:{on.port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        accepted = [ln for ln in metrics.splitlines() if ln.startswith("mlx_cluster_accepted")]
        assert accepted and float(accepted[0].split()[-1]) > 0, metrics


def _refused(*args: str) -> str:
    for command in ("launch", "serve"):
        extra = ("--prompt", "hi") if command == "launch" else ("--port", "0")
        done = subprocess.run(
            [MLX_CLUSTER, command, "--local", "2", *extra, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_bad_draft_model_is_one_line_before_anything_launches(
    tiny_model: Path, tmp_path: Path
) -> None:
    swapped = tmp_path / "swapped"
    shutil.copytree(tiny_model, swapped)
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    model = ("--model", str(tiny_model))
    line = _refused(*model, "--draft-model", str(swapped))
    assert "--draft-model" in line and "vocabulary is not the target's" in line
    assert "2 ids differ" in line
    line = _refused(*model, "--draft-model", str(tmp_path / "nowhere"))
    assert "--draft-model" in line and "no such directory" in line
    line = _refused(*model, "--draft-model", str(tiny_model), "--speculative", "off")
    assert "--speculative on" in line
