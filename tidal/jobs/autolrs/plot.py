"""AutoLRS's schedule drawn against other methods' (loss and LR per compute step)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_schedule(rows_by_method: dict[str, list[dict[str, Any]]], path: str | Path, *,
                  x: str = "compute_steps", target: float | None = None) -> None:
    """Loss (top) and learning rate (bottom, log scale) per method against compute steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, rows in rows_by_method.items():
        xs = [r.get(x, r["step"]) for r in rows]
        ax_loss.plot(xs, [r["loss"] for r in rows], lw=0.8, alpha=0.5, label=f"{name} (train)")
        ev = [(r.get(x, r["step"]), r["val_loss"]) for r in rows if r.get("val_loss") is not None]
        if ev:
            ax_loss.plot(*zip(*ev, strict=True), marker="o", ms=3, label=f"{name} (validation)")
        ax_lr.plot(xs, [r["lr"] for r in rows], label=name)
    if target is not None:
        ax_loss.axhline(target, color="k", ls="--", lw=0.8, label="target")
    ax_loss.set_ylabel("loss")
    ax_loss.legend(fontsize=7)
    ax_lr.set_yscale("log")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel(x.replace("_", " "))
    ax_lr.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
