"""The copy task's learning curve: curve.csv (rewritten atomically at every evaluation) and its
plot (test bit and sequence accuracy against training batches)."""

from __future__ import annotations

import csv
import io
import os

from r2ac.runs import checkpoint

CURVE_FIELDS = (
    "step",
    "updates",
    "seconds",
    "train_loss",
    "train_bit_accuracy",
    "test_loss",
    "test_bit_accuracy",
    "test_sequence_accuracy",
)


def write_curve_csv(curve: list[dict[str, float]], path: str | os.PathLike) -> None:
    """Write the whole curve to `path` atomically (temp file, fsync, rename): a kill leaves
    the previous file or the new one, never half a row."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=CURVE_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(curve)
    checkpoint.write_atomic(text.getvalue().encode(), path)


def read_curve_csv(path: str | os.PathLike) -> list[dict[str, float]]:
    with open(path, newline="") as fh:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def plot_curves(runs: list[tuple[str, list[dict[str, float]]]], path, title: str = "") -> None:
    """Test bit and sequence accuracy against training batches, one line pair per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for label, curve in runs:
        steps = [r["step"] for r in curve]
        for ax, key in zip(axes, ("test_bit_accuracy", "test_sequence_accuracy")):
            ax.plot(steps, [r[key] for r in curve], label=label)
    for ax, name in zip(axes, ("test bit accuracy (every output bit)", "test sequence accuracy")):
        ax.set_xlabel("training batches")
        ax.set_title(name)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.5, color="grey", lw=0.8, ls=":")
    axes[1].legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
