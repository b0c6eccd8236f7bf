"""`mlx-cluster tiny-model DIR`: write a tiny random-weight model for demos and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from launcher.cli.options import DIRECTORY, SEED, Number

# cluster/tiny_model.py's FAMILIES, repeated so that --help needs no MLX import (a test compares)
FAMILIES = (
    "llama", "qwen2", "qwen3", "ministral3", "qwen3_5", "qwen3_moe", "deepseek_v3", "glm4_moe",
    "gpt_oss", "deepseek_v2", "glm4_moe_lite", "exaone_moe", "deepseek_v32", "qwen3_5_moe",
    "minimax", "step3p5",
)  # fmt: skip
# Sane sizes for a model meant to be tiny; cluster/tiny_model.py also caps the total size.
LAYERS = Number(int, 1, 256)
HIDDEN = Number(int, 1, 16384)
HEADS = Number(int, 1, 1024)
HEAD_DIM = Number(int, 1, 1024)
INTERMEDIATE = Number(int, 1, 65536)
BITS = Number(int, 2, 8, note="2, 3, 4, 6 or 8")
GROUP = Number(int, 32, 128, note="32, 64 or 128")
EXPERTS = Number(int, 1, 1024)
COUNT = Number(int, 0, 256)
RANK = Number(int, 0, 16384)
FRACTION = Number(float, 0, 1, low_open=True)
WINDOW = Number(int, 1, 1 << 20)


@click.command("tiny-model")
@click.argument("directory", type=DIRECTORY)
@click.option("--family", type=click.Choice(FAMILIES), default="llama")
@click.option("--layers", type=LAYERS, default=4, show_default=True)
@click.option("--hidden", type=HIDDEN, default=64, show_default=True, help="hidden size")
@click.option("--heads", type=HEADS, default=4, show_default=True, help="attention heads")
@click.option(
    "--kv-heads", type=HEADS, default=2, show_default=True, help="key/value heads (not MLA's)"
)
@click.option(
    "--intermediate", type=INTERMEDIATE, default=None, help="dense MLP width [2 x hidden]"
)
@click.option("--quantize-bits", type=BITS, default=None, help="2, 3, 4, 6 or 8 [none]")
@click.option("--group-size", type=GROUP, default=32, show_default=True, help="quantization group")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--head-dim", type=HEAD_DIM, default=None, help="not qwen2, deepseek_v3 [hidden / heads]"
)
@click.option("--experts", type=EXPERTS, default=None, help="MoE: routed experts [8]")
@click.option(
    "--experts-per-token", type=EXPERTS, default=None, help="MoE: experts a token uses [2]"
)
@click.option("--moe-intermediate", type=INTERMEDIATE, default=None, help="MoE: expert width [64]")
@click.option(
    "--shared-experts", type=EXPERTS, default=None, help="deepseek_v3, glm4_moe: always used [1]"
)
@click.option(
    "--dense-layers",
    type=COUNT,
    default=None,
    help="MoE but gpt_oss: the first N layers dense [qwen3_moe 0, else 1]",
)
@click.option("--sparse-step", type=LAYERS, default=None, help="qwen3_moe: every Nth layer MoE [1]")
@click.option(
    "--expert-groups",
    type=EXPERTS,
    default=None,
    help="deepseek_v3, glm4_moe: n_group [deepseek_v3 2, glm4_moe 1]",
)
@click.option(
    "--groups-per-token", type=EXPERTS, default=None, help="deepseek_v3, glm4_moe: topk_group [1]"
)
@click.option("--q-lora-rank", type=RANK, default=None, help="deepseek_v3, 0 = none [3 x head]")
@click.option("--kv-lora-rank", type=RANK, default=None, help="deepseek_v3 [2 x head]")
@click.option("--qk-rope-dim", type=HEAD_DIM, default=None, help="deepseek_v3 [head / 2]")
@click.option("--qk-nope-dim", type=HEAD_DIM, default=None, help="deepseek_v3 [head]")
@click.option("--v-head-dim", type=HEAD_DIM, default=None, help="deepseek_v3 [head]")
@click.option(
    "--rotary-fraction", type=FRACTION, default=None, help="glm4_moe: partial rotary [0.5]"
)
@click.option("--qk-norm/--no-qk-norm", default=None, help="glm4_moe: query/key norms [on]")
@click.option("--sliding-window", type=WINDOW, default=None, help="gpt_oss, step3p5 [32]")
@click.option(
    "--linear-key-heads", type=HEADS, default=None, help="qwen3_5: linear attention's key heads [2]"
)
@click.option(
    "--linear-value-heads", type=HEADS, default=None, help="qwen3_5: a multiple of them [2 x keys]"
)
@click.option("--linear-key-head-dim", type=HEAD_DIM, default=None, help="qwen3_5 [head]")
@click.option("--linear-value-head-dim", type=HEAD_DIM, default=None, help="qwen3_5 [head]")
@click.option(
    "--full-attention-interval", type=LAYERS, default=None, help="qwen3_5: every Nth layer [2]"
)
@click.option(
    "--other-heads", type=HEADS, default=None, help="step3p5: sliding layers' heads [2 x heads]"
)
@click.option(
    "--other-kv-heads", type=HEADS, default=None, help="step3p5: their KV heads [kv-heads]"
)
def tiny_model(directory: Path, **options: Any) -> int:
    """Write a random-weight FAMILY model (split per layer, offline tokenizer) into DIRECTORY.

    mlx-lm loads it like a real checkpoint; its text is gibberish by design. The options after
    --seed shape the mixture-of-experts families and apply to the families they name (MoE:
    qwen3_moe, deepseek_v3, glm4_moe, gpt_oss); "head" is hidden / heads.
    """
    from cluster.tiny_model import write_tiny_model  # imports MLX: only when asked

    # click hands each option over as a keyword named as write_tiny_model's own parameter
    out = write_tiny_model(directory, **options)
    family, layers, hidden = options["family"], options["layers"], options["hidden"]
    quantize_bits = options["quantize_bits"]
    quant = f", {quantize_bits}-bit" if quantize_bits else ""
    click.echo(f"wrote a tiny {family} model ({layers} layers, hidden {hidden}{quant}) to {out}")
    return 0
