"""`mlx-cluster import-gguf FILE.gguf DIR`: a llama GGUF (llama.cpp, Ollama) as an mlx-lm folder."""

from __future__ import annotations

from pathlib import Path

import click

from launcher.cli.options import DIRECTORY, FILE


@click.command("import-gguf")
@click.argument("gguf", type=FILE, metavar="FILE.gguf")
@click.argument("directory", type=DIRECTORY)
@click.option(
    "--dtype",
    type=click.Choice(["keep", "float16", "float32"]),
    default="keep",
    show_default=True,
    help="keep: quantized as in the file (Q4_0/Q4_1/Q8_0 stay 4/8-bit); float16/float32: "
    "dequantized (MLX's CPU backend batches float32 matmuls, not 4-bit ones).",
)
def import_gguf_cmd(gguf: Path, directory: Path, dtype: str) -> int:
    """Convert a llama-family GGUF FILE into an mlx-lm model folder DIRECTORY (new or empty).

    The folder is split per layer like a Hugging Face checkpoint (Q/K rows in Hugging Face
    order, so tensor parallel splits heads right); the tokenizer is rebuilt from the file.
    """
    from cluster.gguf.write import import_gguf  # imports MLX: only when asked

    done = import_gguf(gguf, directory, dtype)
    f = done.facts
    click.echo(
        f"wrote a llama model ({f.layers} layers, hidden {f.hidden}, {done.quantization}, "
        f"{done.bytes / 1e6:.0f} MB in {done.files} files) to {done.directory}"
    )
    return 0
