"""Plot columns of metrics.csv against frames for several runs, one panel per column.

    r2ac plot RUN_DIR [RUN_DIR ...] --out fig.png \
        [--metrics return_mean value_scale] [--labels seed0 seed1] [--smooth 250000]

Each run is one line per panel; `--smooth F` averages each column over a trailing window of
F frames (0: raw rows). Columns are those of a run's metrics.csv (docs/rl.md, "Run directory");
`value_scale` is PopArt's sigma. Exit 2 with one line when a run or a column is missing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from r2ac.errors import ConfigError, check_writable
from r2ac.experiments.report import curve_of


def trailing_mean(frames: np.ndarray, values: np.ndarray, window: float) -> np.ndarray:
    """Mean of `values` over the rows whose frames lie in (f - window, f], for each row's f."""
    if window <= 0:
        return values
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    first = np.searchsorted(frames, frames - window, side="right")  # first row in the window
    last = np.arange(1, len(values) + 1)
    return (cumulative[last] - cumulative[first]) / (last - first)


def run_columns(run_dir: Path, metrics: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{column: (frames, values)} of one run, rows where the column is empty dropped."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        raise ValueError(f"{path} does not exist (not a run directory?)")
    with path.open() as f:
        header = f.readline().strip().split(",")
    for name in metrics:
        if name not in header:
            raise ValueError(f"{path} has no column {name!r}; it has {', '.join(header)}")
    empty = (np.zeros(0), np.zeros(0))
    return {name: curve_of(run_dir, name) or empty for name in metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="r2ac plot", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--metrics", nargs="+", default=["return_mean"])
    parser.add_argument("--labels", nargs="+", help="one per run (default: the directory names)")
    parser.add_argument("--smooth", type=float, default=0.0, help="trailing window in frames")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    try:
        if not (math.isfinite(args.smooth) and args.smooth >= 0):
            raise ConfigError(f"--smooth must be a finite number of frames >= 0, got {args.smooth}")
        check_writable(args.out, "--out", is_file=True)
    except ConfigError as exc:
        print(f"r2ac plot: error: {exc}", file=sys.stderr)
        return 2
    labels = args.labels or [run.name for run in args.runs]
    if len(labels) != len(args.runs):
        parser.exit(2, f"plot_runs: {len(labels)} labels for {len(args.runs)} runs\n")
    try:
        data = [run_columns(run, args.metrics) for run in args.runs]
    except ValueError as error:
        print(f"plot_runs: {error}", file=sys.stderr)
        return 2

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.metrics), figsize=(5.5 * len(args.metrics), 3.8))
    for ax, name in zip(np.atleast_1d(axes), args.metrics):
        for columns, label in zip(data, labels):
            frames, values = columns[name]
            ax.plot(frames, trailing_mean(frames, values, args.smooth), label=label, lw=1.2)
        ax.set_xlabel("frames")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=110)
    except OSError as exc:
        print(f"r2ac plot: error: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
