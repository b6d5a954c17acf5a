"""Frames/s of the runtimes side by side: `r2ac train` runs, alternated, medians of repeats.

    python scripts/runtime_fps.py --repeats 3 -- --total-frames 300000

Each repeat runs every runtime once (the order rotates between repeats), with the same
`r2ac train` options (after `--`), `--num-threads 1`, no evaluation. Per run it reports the
steady frames/s (metrics.csv, from the row at 20 % of the updates to the last: start-up
excluded), the wall time of the whole command (start-up included) and, for ray, the start-up
lines it logs (local Ray, actors, bytes a segment). The machine's load average is printed
before and after each run.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def steady_fps(metrics: Path) -> float:
    rows = list(csv.DictReader(metrics.open()))
    first, last = rows[len(rows) // 5], rows[-1]
    frames = float(last["frames"]) - float(first["frames"])
    return frames / (float(last["time_s"]) - float(first["time_s"]))


def load() -> float:
    return os.getloadavg()[0]


def run_one(runtime: str, options: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "r2ac.cli", "train", "--runtime", runtime, "--num-threads", "1"]
    cmd += ["--no-eval-at-end", "--no-progress", "--log-every", "5", "--out-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    before, t0 = load(), time.perf_counter()
    proc = subprocess.run(cmd + options, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{runtime} failed:\n{proc.stderr}")
    ray_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ray: ")]
    return {
        "runtime": runtime,
        "fps": steady_fps(out / "metrics.csv"),
        "wall_s": wall,
        "load": (before, load()),
        "ray": ray_lines,
    }


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, options = argv[:i], argv[i + 1 :]
    else:
        options = []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", nargs="+", default=["serial", "parallel", "ray"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[str, list[dict]] = {r: [] for r in args.runtimes}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            order = (
                args.runtimes[rep % len(args.runtimes) :]
                + args.runtimes[: rep % len(args.runtimes)]
            )
            for runtime in order:
                row = run_one(runtime, options, Path(tmp) / f"{runtime}-{rep}")
                results[runtime].append(row)
                print(
                    f"rep {rep} {runtime:9s} {row['fps']:8.0f} frames/s  wall {row['wall_s']:5.1f} s"
                    f"  load {row['load'][0]:.1f} -> {row['load'][1]:.1f}  {' | '.join(row['ray'])}",
                    flush=True,
                )
    print("\nmedian steady frames/s (wall s):")
    medians = {r: statistics.median(x["fps"] for x in rows) for r, rows in results.items()}
    for r, rows in results.items():
        wall = statistics.median(x["wall_s"] for x in rows)
        print(f"  {r:9s} {medians[r]:8.0f}  ({wall:.1f} s)")
    if "ray" in medians and "parallel" in medians:
        print(f"  ray / parallel = {medians['ray'] / medians['parallel']:.2f}")
        ratios = [
            a["fps"] / b["fps"] for a, b in zip(results["ray"], results["parallel"], strict=True)
        ]
        print(f"  per repeat: {', '.join(f'{x:.2f}' for x in ratios)}")
    start = [
        float(m.group(1))
        for x in results.get("ray", [])
        for ln in x["ray"]
        if (m := re.search(r"started in ([0-9.]+) s", ln))
    ]
    if start:
        print(f"  local Ray start-up: median {statistics.median(start):.1f} s ({start})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
