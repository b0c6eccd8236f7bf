"""`mlx-cluster tiny-model DIR`: write a tiny random-weight model for demos and tests."""

from __future__ import annotations

from pathlib import Path

import click

from launcher.cli.options import DIRECTORY, SEED, Number

# Sane sizes for a model meant to be tiny; cluster/tiny_model.py also caps the total size.
LAYERS = Number(int, 1, 256)
HIDDEN = Number(int, 1, 16384)
HEADS = Number(int, 1, 1024)
INTERMEDIATE = Number(int, 1, 65536)
BITS = Number(int, 2, 8, note="2, 3, 4, 6 or 8")
GROUP = Number(int, 32, 128, note="32, 64 or 128")


@click.command("tiny-model")
@click.argument("directory", type=DIRECTORY)
@click.option("--family", type=click.Choice(["llama", "qwen2", "qwen3"]), default="llama")
@click.option("--layers", type=LAYERS, default=4, show_default=True)
@click.option("--hidden", type=HIDDEN, default=64, show_default=True, help="hidden size")
@click.option("--heads", type=HEADS, default=4, show_default=True, help="attention heads")
@click.option("--kv-heads", type=HEADS, default=2, show_default=True, help="key/value heads")
@click.option("--intermediate", type=INTERMEDIATE, default=None, help="MLP width [2 x hidden]")
@click.option("--quantize-bits", type=BITS, default=None, help="2, 3, 4, 6 or 8 [none]")
@click.option("--group-size", type=GROUP, default=32, show_default=True, help="quantization group")
@click.option("--seed", type=SEED, default=0, show_default=True)
def tiny_model(
    directory: Path,
    family: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int | None,
    quantize_bits: int | None,
    group_size: int,
    seed: int,
) -> int:
    """Write a random-weight FAMILY model (split per layer, offline tokenizer) into DIRECTORY.

    mlx-lm loads it like a real checkpoint; its text is gibberish by design.
    """
    from cluster.tiny_model import write_tiny_model  # imports MLX: only when asked

    out = write_tiny_model(
        directory,
        family=family,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        quantize_bits=quantize_bits,
        group_size=group_size,
        seed=seed,
    )
    quant = f", {quantize_bits}-bit" if quantize_bits else ""
    click.echo(f"wrote a tiny {family} model ({layers} layers, hidden {hidden}{quant}) to {out}")
    return 0
