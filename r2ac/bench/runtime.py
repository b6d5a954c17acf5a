"""Frames/s of the runtimes side by side: `r2ac train` runs, alternated, medians of repeats.

    r2ac bench runtime --repeats 3 -- --total-frames 300000
    r2ac bench runtime --runtimes parallel ray:actor ray:learner -- ...
    r2ac bench runtime --runtimes parallel@elstm-bptt parallel@elstm-rtrl \
        --repeats 1 --seconds 200 --json-out e2e.json -- --device cuda --env ...

A runtime may name its `--sensitivity-carry` after a colon (`ray:actor`: the actors ship
their sensitivities with every segment; `ray:learner`, ray's default, the learner carries
them) and its `--core` after an at sign (`parallel@elstm-bptt`, `parallel:learner@elstm-rtrl`).

Each repeat runs every runtime once (the order rotates between repeats), with the same
`r2ac train` options (after `--`), `--num-threads 1`, no evaluation. Per run it reports the
steady frames/s (metrics.csv, from the row at 20 % of the updates to the last: start-up
excluded), the wall time of the whole command (start-up included) and, for ray, the start-up
lines it logs (local Ray, actors, bytes a segment). The machine's load average is printed
before and after each run.

It also reports the CPU time the whole process tree (learner, actors, and for ray its
raylet, GCS and workers) spends per frame in the same steady window: sampled from /proc
twice a second together with metrics.csv's frame count. Frames/s depend on what else the
machine runs; CPU time per frame much less so, which makes this the figure to compare on a
shared box (a runtime whose processes wait costs no CPU, so it shows cost, not idleness).

And the learner's own figures from metrics.csv over the same window: the median wall time of
an update (`learner_ms`; the frames/s the learner alone could take is M x B / learner_ms,
which says whether a run was bound by its actors or its learner) and, on CUDA, the peak
memory torch allocated (`learner_cuda_peak_mib`). `--seconds S` stops each run with SIGINT
S seconds after its first metrics row (start-up excluded; a clean stop: the update in flight
finishes and metrics.csv is whole), for runs whose speed is not known in advance, e.g. on a
GPU machine with a time limit.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout, for PYTHONPATH


def steady_rows(metrics: Path) -> list[dict[str, str]]:
    """metrics.csv's rows from the one at 20 % of the updates to the last (start-up out)."""
    rows = list(csv.DictReader(metrics.open()))
    return rows[len(rows) // 5 :]


def steady_fps(metrics: Path) -> float:
    rows = steady_rows(metrics)
    first, last = rows[0], rows[-1]
    frames = float(last["frames"]) - float(first["frames"])
    return frames / (float(last["time_s"]) - float(first["time_s"]))


def learner_figures(metrics: Path) -> tuple[float, float]:
    """(median learner_ms, largest learner_cuda_peak_mib) of the steady rows; nan where
    metrics.csv has no such value (an older run, or a learner on the CPU)."""
    rows = steady_rows(metrics)

    def values(column: str) -> list[float]:
        return [float(r[column]) for r in rows if r.get(column) not in (None, "")]

    ms, peak = values("learner_ms"), values("learner_cuda_peak_mib")
    return (statistics.median(ms) if ms else math.nan, max(peak) if peak else math.nan)


def load() -> float:
    return os.getloadavg()[0]


def _cpu_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, user + system clock ticks) of every process in /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) "
        table[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def tree_cpu_s(root: int, seen: dict[int, int]) -> float:
    """CPU seconds of `root` and its descendants so far; `seen` keeps each process's last
    reading, so that processes which exited still count (up to their last sample)."""
    table = _cpu_ticks()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in table:
            seen[pid] = table[pid][1]
        stack.extend(children.get(pid, []))
    return sum(seen.values()) / os.sysconf("SC_CLK_TCK")


def last_frames(metrics: Path) -> float | None:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 2:
        return None
    header, last = lines[0].split(","), lines[-1].split(",")
    try:
        return float(last[header.index("frames")])
    except (ValueError, IndexError):
        return None


def steady_cpu_us_per_frame(samples: list[tuple[float, float]]) -> float:
    """CPU microseconds a frame between the sample at 20 % of the frames and the last."""
    final = samples[-1][0]
    window = [s for s in samples if s[0] >= 0.2 * final]
    (f0, c0), (f1, c1) = window[0], window[-1]
    return float("nan") if f1 <= f0 else 1e6 * (c1 - c0) / (f1 - f0)


def runtime_of(spec: str) -> str:
    """`ray` of `ray:learner@elstm-rtrl`."""
    return spec.partition("@")[0].partition(":")[0]


def _follow(proc: subprocess.Popen, metrics: Path, seconds: float | None) -> list:
    """(frames, CPU seconds of the process tree) twice a second until the run ends; with
    `seconds`, SIGINT once that long after its first metrics row (start-up excluded)."""
    samples: list[tuple[float, float]] = []
    seen: dict[int, int] = {}
    started = None
    while proc.poll() is None:
        if seconds is not None and started is not None and time.perf_counter() > started + seconds:
            proc.send_signal(signal.SIGINT)  # once: the run stops after this update
            seconds = None
        cpu, frames = tree_cpu_s(proc.pid, seen), last_frames(metrics)
        if frames is not None and (not samples or frames > samples[-1][0]):
            samples.append((frames, cpu))
            started = started or time.perf_counter()
        time.sleep(0.5)
    return samples


def train_args(spec: str) -> list[str]:
    """The `r2ac train` options a runtime spec stands for (module docstring)."""
    runtime, core = runtime_of(spec), spec.partition("@")[2]
    carry = spec.partition("@")[0].partition(":")[2]
    args = ["--runtime", runtime, "--num-threads", "1"]
    args += ["--sensitivity-carry", carry] if carry else []
    args += ["--core", core] if core else []
    return [*args, "--no-eval-at-end", "--no-progress", "--log-every", "5"]


def check_args(args: argparse.Namespace, options: list[str]) -> None:
    """ConfigError for a count out of range, an unwritable --json-out or a runtime whose
    `r2ac train` options (with those after `--`) that command would refuse; before any run."""
    from r2ac.bench.options import MAX_REPEATS, check_count, check_output, check_train_options
    from r2ac.errors import ConfigError

    check_count(args.repeats, "--repeats", 1, MAX_REPEATS)
    if args.seconds is not None and not 0 < args.seconds <= 86_400:
        raise ConfigError(f"--seconds must be in (0, 86400], got {args.seconds}")
    if not args.runtimes:
        raise ConfigError("--runtimes needs at least one value")
    check_output(args.json_out, "--json-out")
    for spec in args.runtimes:
        check_train_options([*train_args(spec), *options], f"--runtimes {spec}")


def run_one(spec: str, options: list[str], out: Path, seconds: float | None = None) -> dict:
    cmd = [sys.executable, "-m", "r2ac.cli", "train", *train_args(spec), "--out-dir", str(out)]
    # the repository first, then whatever the caller's PYTHONPATH holds (carried packages)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    before, t0 = load(), time.perf_counter()
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd + options, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            samples = _follow(proc, out / "metrics.csv", seconds)
        finally:  # this command stopped (Ctrl-C, a timeout): the run must not go on alone
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wall = time.perf_counter() - t0
        stderr.seek(0)
        err = stderr.read()
    if proc.returncode not in (0, 128 + signal.SIGINT):
        raise SystemExit(f"{spec} failed:\n{err}")
    ray_lines = [ln for ln in err.splitlines() if ln.startswith("ray: ")]
    learner_ms, cuda_peak_mib = learner_figures(out / "metrics.csv")
    return {
        "runtime": spec,
        "fps": steady_fps(out / "metrics.csv"),
        "learner_ms": learner_ms,
        "cuda_peak_mib": cuda_peak_mib,
        "wall_s": wall,
        "cpu_us": steady_cpu_us_per_frame(samples) if len(samples) > 1 else float("nan"),
        "load": (before, load()),
        "ray": ray_lines,
    }


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This command's options, and the `r2ac train` options after `--`."""
    options: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, options = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(prog="r2ac bench runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", nargs="+", default=["serial", "parallel", "ray"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--seconds", type=float, help="stop each run (SIGINT) this long after its first update"
    )
    parser.add_argument("--json-out", type=Path, help="every run's figures, as JSON")
    return parser.parse_args(argv), options


def run_alternated(args: argparse.Namespace, options: list[str]) -> dict[str, list[dict]]:
    """Every runtime once per repeat, the order rotated between repeats; a line a run."""
    results: dict[str, list[dict]] = {r: [] for r in args.runtimes}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            k = rep % len(args.runtimes)
            for runtime in args.runtimes[k:] + args.runtimes[:k]:
                row = run_one(runtime, options, Path(tmp) / f"{runtime}-{rep}", args.seconds)
                results[runtime].append(row)
                print(
                    f"rep {rep} {runtime:11s} {row['fps']:8.0f} frames/s  {row['cpu_us']:5.1f} CPU us/frame"
                    f"  learner {row['learner_ms']:.1f} ms/update, CUDA peak {row['cuda_peak_mib']:.0f} MiB"
                    f"  wall {row['wall_s']:5.1f} s"
                    f"  load {row['load'][0]:.1f} -> {row['load'][1]:.1f}  {' | '.join(row['ray'])}",
                    flush=True,
                )
    return results


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(x[key] for x in rows)


def print_summary(runtimes: list[str], results: dict[str, list[dict]]) -> None:
    """Medians per runtime, ratios to the first, and ray against parallel where both ran."""
    print("\nmedian steady frames/s, CPU us a frame (all processes), wall s:")
    medians = {r: _median(rows, "fps") for r, rows in results.items()}
    cpu = {r: _median(rows, "cpu_us") for r, rows in results.items()}
    learner = {r: _median(rows, "learner_ms") for r, rows in results.items()}
    for r, rows in results.items():
        peak = max(x["cuda_peak_mib"] for x in rows)
        print(
            f"  {r:11s} {medians[r]:8.0f}  {cpu[r]:6.1f} us  ({_median(rows, 'wall_s'):.1f} s)"
            f"  learner {learner[r]:.1f} ms/update  CUDA peak {peak:.0f} MiB"
        )
    first = runtimes[0]
    for r in runtimes[1:]:  # e.g. parallel@elstm-rtrl against parallel@elstm-bptt
        print(
            f"  {r} / {first}: frames/s {medians[r] / medians[first]:.2f}, "
            f"learner updates/s {learner[first] / learner[r]:.2f}"
        )
    for ray in (r for r in medians if runtime_of(r) == "ray" and "parallel" in medians):
        print(f"  {ray} / parallel = {medians[ray] / medians['parallel']:.2f}")
        ratios = [
            a["fps"] / b["fps"] for a, b in zip(results[ray], results["parallel"], strict=True)
        ]
        print(f"    per repeat: {', '.join(f'{x:.2f}' for x in ratios)}")
        print(f"    CPU a frame, {ray} / parallel = {cpu[ray] / cpu['parallel']:.2f}")
    start = [
        float(m.group(1))
        for r, rows in results.items()
        if runtime_of(r) == "ray"
        for x in rows
        for ln in x["ray"]
        if (m := re.search(r"started in ([0-9.]+) s", ln))
    ]
    if start:
        print(f"  local Ray start-up: median {statistics.median(start):.1f} s ({start})")


def main(argv: list[str]) -> int:
    from r2ac.errors import ConfigError

    args, options = _parse(argv)
    try:
        check_args(args, options)
    except ConfigError as exc:
        print(f"r2ac bench runtime: error: {exc}", file=sys.stderr)
        return 2
    results = run_alternated(args, options)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"options": options, "runs": results}, indent=1))
    print_summary(args.runtimes, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
