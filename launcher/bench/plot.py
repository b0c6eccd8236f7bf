"""`bench --plot FILE.png`: decode tok/s against hosts, measured and predicted, per strategy.

matplotlib is a dev extra, imported only here, with the Agg backend (no display needed).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from launcher.bench.report import Row
from topology.errors import InputError


def require_matplotlib() -> None:
    """Refuse --plot before any run when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install matplotlib") from None
    if importlib.util.find_spec("matplotlib.pyplot") is None:
        raise InputError("--plot needs matplotlib: pip install matplotlib")


def write_plot(path: Path, rows: Sequence[Row], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    for i, strategy in enumerate(strategies):
        mine = sorted((r for r in rows if r.strategy == strategy), key=lambda r: r.hosts)
        color = f"C{i}"
        hosts = [r.hosts for r in mine]
        ax.plot(hosts, [r.measured.generation_tps for r in mine], "o-", color=color,
                label=f"{strategy}: measured")  # fmt: skip
        for attr, style, what in (
            ("predicted_decode_tok_s", "s--", "predicted"),
            ("predicted_calibrated_tok_s", "^:", "predicted, calibrated"),
        ):
            points = [(r.hosts, getattr(r, attr)) for r in mine if getattr(r, attr) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, style, color=color, alpha=0.7, label=f"{strategy}: {what}")
    ax.set_xlabel("hosts")
    ax.set_ylabel("decode tokens/s")
    ax.set_xticks(sorted({r.hosts for r in rows}))
    values = [
        v
        for r in rows
        for v in (r.measured.generation_tps, r.predicted_decode_tok_s, r.predicted_calibrated_tok_s)
        if v is not None and v > 0
    ]
    if values and max(values) > 20 * min(values):  # predictions far off: keep both readable
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise InputError(f"--plot {path}: cannot write it ({e})") from None
    finally:
        plt.close(fig)
