"""Copy-task capacity against width: a Markdown table and a plot from finished `r2ac copy` runs.

Usage:
    python scripts/copy_capacity.py runs/copy_cap_l20_* --png docs/img/copy_capacity.png

Every run directory must hold the results.json that `r2ac copy` writes. Runs are grouped into
one line per (core, rule, readout, batches, l); x is the width N, y the longest pattern length
k such that every test sequence with a pattern of k bits or fewer is copied without an error
(`longest_all_right`), the plain measure of how many bits a model holds and writes back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict


def load(run_dirs: list[str]) -> list[dict]:
    runs = []
    for d in run_dirs:
        path = os.path.join(d, "results.json")
        if not os.path.isfile(path):
            print(f"skipping {d}: no results.json (unfinished run?)", file=sys.stderr)
            continue
        with open(path) as fh:
            result = json.load(fh)
        config = {}  # the options results.json does not repeat (lr_final, chrono_init, dtype)
        config_path = os.path.join(d, "config.json")
        if os.path.isfile(config_path):
            with open(config_path) as fh:
                config = json.load(fh)["config"]
        runs.append({"dir": d, **config, **result})
    if not runs:
        raise SystemExit("no finished runs among the given directories")
    return runs


def group_label(r: dict) -> str:
    readout = f"MLP readout {r['readout_hidden']}" if r.get("readout_hidden") else "linear readout"
    lr = f"lr {r['lr']:g}" + (f" -> {r['lr_final']:g}" if r.get("lr_final") is not None else "")
    extras = [
        name
        for name, on in (
            ("chrono init", r.get("chrono_init")),
            ("float64", r.get("dtype") == "float64"),
        )
        if on
    ]
    return ", ".join(
        [
            f"{r['core']}-{r['rule']}",
            readout,
            *extras,
            f"B = {r['batch_size']}",
            lr,
            f"{r['train_steps']:,} batches",
            f"l = {r['length']}",
        ]
    )


def table(runs: list[dict]) -> str:
    lines = [
        "| model | N | every test sequence right up to k | test bits | test sequences | training s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(runs, key=lambda r: (group_label(r), r["hidden"])):
        lines.append(
            f"| {group_label(r)} | {r['hidden']} | {r['longest_all_right']} | "
            f"{r['bit_accuracy']:.4f} | {r['sequence_accuracy']:.3f} | {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[group_label(r)].append(r)
    fig, ax = plt.subplots(figsize=(7, 4.2 + 0.2 * len(groups)))
    markers = "osD^vP"  # distinct shapes, shrinking, so that coinciding points stay visible
    for i, (label, rs) in enumerate(sorted(groups.items())):
        rs.sort(key=lambda r: r["hidden"])
        ax.plot(
            [r["hidden"] for r in rs],
            [r["longest_all_right"] for r in rs],
            "-",
            marker=markers[i % len(markers)],
            markersize=11 - 2 * (i % 4),
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("hidden units N")
    ax.set_ylabel("every test pattern right up to k bits")
    ax.set_title("copy task: bits held and written back, against width")
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15)
    )  # below: lines stay visible
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories of r2ac copy")
    ap.add_argument("--png", default=None, help="write the plot here")
    args = ap.parse_args(argv)
    runs = load(args.runs)
    print(table(runs))
    if args.png:
        plot(runs, args.png)
        print(f"plot -> {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
