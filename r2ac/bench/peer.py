"""r2ac beside its peer, Sample Factory 2.1.1, over seeds on POPGym: success and frames/s.

    r2ac bench peer [--envs RepeatPreviousEasy,CountRecallEasy] [--seeds 0-4 | 5]
        [--frames 1000000] [--peer-mode async|serial] [--success 0.8] [--sf-args "..."]
        [--json-out F] [-- r2ac train flags]
    r2ac bench peer --setup-only        # create or check the peer's venv only

Sample Factory (SF) is no dependency of r2ac: it lives in its own venv outside the project's
(`--peer-venv`, created on first use: CPU torch first, so that nothing pulls the CUDA build,
then SF and its envs; a few minutes and ~1 GB), where r2ac/bench/peer_sf.py trains and
evaluates it (that file says what SF runs and how it is evaluated).

Per env and seed, alternated run by run (r2ac, SF, r2ac, SF, ...):
- r2ac: `r2ac train --preset popgym --env gym/popgym-<Env>-v0 --core gru-bptt
  --unroll-length 4 --seed S --total-frames F` and the flags after `--`; serial runtime,
  greedy evaluation (3 x 100 episodes) at the end.
- SF: APPO with the same PPO settings and a GRU 128, in its normal asynchronous mode
  (2 workers x 16 envs) or, with `--peer-mode serial`, in one process (1 worker x 32 envs);
  `--sf-args` goes to the end of SF's arguments. Greedy evaluation under r2ac's protocol.

The table: per system and env, each seed's greedy score, the successes out of N (a run
succeeds when its greedy score reaches `--success`), the mean +- std over seeds, the median
frames/s and its ratio to the peer's. Frames/s are steady (start-up left out, the rule of
`r2ac bench runtime`: from the progress point at 20 % of them to the last; r2ac's points are
metrics.csv's rows, SF's its "Total num frames" lines), or the system's own end-to-end figure
where a run is too short for that (marked "e2e"). Neither includes the evaluation. Exit
status 1 if a run failed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SF_SIDE = Path(__file__).with_name("peer_sf.py")
SF_VERSION = "2.1.1"
# Pins that install together on Python 3.11; SF 2.1.1 wants gymnasium < 1.0 and numpy < 2.
PEER_TORCH = "torch==2.13.0"
PEER_PACKAGES = [f"sample-factory=={SF_VERSION}", "popgym==1.0.7", "gymnasium==0.29.1", "numpy<2"]
SUCCESS_HELP = (
    "a run succeeds when its greedy score is at least this (default 0.8: on "
    "RepeatPreviousEasy a policy without memory scores -0.5 and the optimum is 1.0, so 0.8 "
    "means the recall was learned; set it per env)"
)


def parse_seeds(text: str) -> list[int]:
    """'0-4' or '3,7,9' or '0-2,5' -> those seeds; a plain number N -> seeds 0..N-1."""
    if text.isdigit():
        return list(range(int(text)))
    seeds = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


MAX_FRAMES = 10**10  # training frames of one run
MAX_SEEDS = 1_000


def check_args(args) -> None:
    """ConfigError for a count or fraction out of range, seeds that do not parse, no envs, or
    an output that cannot be written."""
    from r2ac.bench.options import MAX_THREADS, check_count, check_output
    from r2ac.errors import ConfigError, check_writable

    check_count(args.frames, "--frames", 1, MAX_FRAMES)
    check_count(args.peer_threads, "--peer-threads", 1, MAX_THREADS)
    if not 0 < args.success <= 1:
        raise ConfigError(f"--success must be in (0, 1], got {args.success}")
    if not [e for e in args.envs.split(",") if e]:
        raise ConfigError("--envs needs at least one env")
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError:
        raise ConfigError(f"--seeds: '0-4', '0,3,7' or a count N, got {args.seeds!r}") from None
    if not 1 <= len(seeds) <= MAX_SEEDS or min(seeds) < 0:
        raise ConfigError(f"--seeds must name 1..{MAX_SEEDS} seeds >= 0, got {args.seeds!r}")
    check_output(args.json_out, "--json-out")
    if args.out_root is not None:
        check_writable(args.out_root, "--out-root")


def env_id(name: str) -> str:
    """'RepeatPreviousEasy' or 'popgym-RepeatPreviousEasy-v0' -> the Gymnasium id."""
    name = name.removeprefix("gym/")
    return name if name.startswith("popgym-") else f"popgym-{name}-v0"


def short(name: str) -> str:
    return env_id(name).removeprefix("popgym-").removesuffix("-v0")


def steady_fps(points: list[tuple[float, float]]) -> float | None:
    """(frames, seconds) points -> frames/s from the point at 20 % of them to the last;
    None with fewer than 2 points."""
    points = points[len(points) // 5 :]
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        return None
    return (points[-1][0] - points[0][0]) / (points[-1][1] - points[0][1])


def r2ac_progress(metrics_csv: Path, log_text: str) -> tuple[list, float | None]:
    """(frames, seconds) points of metrics.csv, and the run's own end-to-end frames/s."""
    points = [(float(r["frames"]), float(r["time_s"])) for r in csv.DictReader(metrics_csv.open())]
    m = re.search(r"\d+ frames, \d+ updates in .*?\(([\d.]+) frames/s\)", log_text)
    return points, float(m.group(1)) if m else None


def sf_progress(log_text: str) -> tuple[list, float | None]:
    """(frames, seconds) points of SF's sf_log.txt (its report lines with frames > 0), and its
    end-to-end frames/s (the "Collected ..., FPS:" line)."""
    points = []
    report = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\] Fps is .*?Total num frames: (\d+)"
    for m in re.finditer(report, log_text):
        if int(m.group(2)) > 0:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            points.append((float(m.group(2)), t))
    m = re.search(r"Collected \{0: \d+\}, FPS: ([\d.]+)", log_text)
    return points, float(m.group(1)) if m else None


def frames_per_second(points: list, e2e: float | None) -> tuple[float | None, str]:
    steady = steady_fps(points)
    return (steady, "steady") if steady else (e2e, "e2e")


def successes(scores: list[float | None], threshold: float) -> int:
    """Runs whose greedy score reaches the threshold (a failed run, None, is no success)."""
    return sum(s is not None and s >= threshold for s in scores)


def summary(records: list[dict], system: str, env: str, threshold: float) -> dict:
    """One system's figures on one env over its seeds."""
    runs = sorted((r for r in records if r["system"] == system and r["env"] == env),
                  key=lambda r: r["seed"])  # fmt: skip
    scores = [r.get("greedy") for r in runs]
    done = [s for s in scores if s is not None]
    fps = [r["fps"] for r in runs if r.get("fps")]
    return {
        "system": system, "env": env, "seeds": [r["seed"] for r in runs], "greedy": scores,
        "successes": successes(scores, threshold), "n": len(runs),
        "mean": statistics.fmean(done) if done else None,
        "std": statistics.stdev(done) if len(done) > 1 else 0.0 if done else None,
        "fps": statistics.median(fps) if fps else None,
        "e2e": any(r.get("fps_kind") == "e2e" for r in runs),
    }  # fmt: skip


def table(rows: list[dict], labels: dict[str, str], threshold: float) -> str:
    """Markdown: one line per system and env; the ratio is frames/s over the peer's (sf)."""
    lines = [
        f"| system | env | greedy per seed | successes (>= {threshold:g}) | mean +- std "
        "| frames/s (median) | ratio to peer |",
        "|---|---|---|---|---|---|---|",
    ]
    peer = {r["env"]: r["fps"] for r in rows if r["system"] == "sf"}
    for r in rows:
        scores = ", ".join(
            f"{s}: {'failed' if g is None else f'{g:.3f}'}" for s, g in zip(r["seeds"], r["greedy"])
        )
        mean = "-" if r["mean"] is None else f"{r['mean']:.3f} +- {r['std']:.3f}"
        fps = "-" if r["fps"] is None else f"{r['fps']:.0f}" + (" (e2e)" if r["e2e"] else "")
        ref = peer.get(r["env"])
        ratio = f"{r['fps'] / ref:.2f}x" if r["fps"] and ref else "-"
        lines.append(
            f"| {labels[r['system']]} | {r['env']} | {scores} | {r['successes']}/{r['n']} "
            f"| {mean} | {fps} | {ratio} |"
        )
    return "\n".join(lines)


def setup_peer(venv: Path) -> Path:
    """The peer venv's python, the venv created first if need be."""
    py = venv / "bin" / "python"
    stamp = venv / f".peer-sf-{SF_VERSION}"
    if stamp.exists():
        return py
    print(f"[peer] setting up {venv} (torch, then sample-factory {SF_VERSION})", file=sys.stderr)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, PEER_TORCH], check=True)
    subprocess.run([*pip, *PEER_PACKAGES], check=True)
    check = "import sample_factory, popgym, torch; print(torch.__version__)"
    version = subprocess.run([str(py), "-c", check], check=True, capture_output=True, text=True)
    if "+cpu" not in version.stdout:
        print(f"[peer] warning: the peer's torch is {version.stdout.strip()}, not the CPU build",
              file=sys.stderr)  # fmt: skip
    stamp.touch()
    return py


def run_logged(cmd: list[str], log: Path, env: dict | None = None) -> dict:
    """Run cmd with its output in log; the record's shared fields."""
    load = os.getloadavg()
    start = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode
    return {"cmd": shlex.join(cmd), "log": str(log), "rc": rc,
            "wall_s": round(time.perf_counter() - start, 1),
            "loadavg": [round(x, 2) for x in (*load, *os.getloadavg())]}  # fmt: skip


def run_r2ac(args, env: str, seed: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "r2ac.cli", "train", "--preset", "popgym",
           "--env", f"gym/{env_id(env)}", "--core", "gru-bptt", "--unroll-length", "4",
           "--seed", str(seed), "--total-frames", str(args.frames), "--out-dir", str(out),
           "--no-progress", *args.r2ac_args]  # fmt: skip
    rec = run_logged(cmd, out.with_suffix(".log"))
    if rec["rc"] == 0:
        points, e2e = r2ac_progress(out / "metrics.csv", Path(rec["log"]).read_text())
        rec["fps"], rec["fps_kind"] = frames_per_second(points, e2e)
        rec["greedy"] = json.loads((out / "eval.json").read_text())["mean"]
    return rec


def run_sf(args, env: str, seed: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = out / "result.json"
    # -P: the script's folder (r2ac/bench, whose module names are common words) stays off
    # the peer's import path
    cmd = [str(args.peer_python), "-P", str(SF_SIDE), "--env", env_id(env), "--seed", str(seed),
           "--frames", str(args.frames), "--train-dir", str(out), "--mode", args.peer_mode,
           "--threads", str(args.peer_threads), "--result", str(result),
           "--sf-args", args.sf_args]  # fmt: skip
    child_env = {**os.environ, "OMP_NUM_THREADS": str(args.peer_threads), "WANDB_MODE": "disabled"}
    rec = run_logged(cmd, out / "stdout.log", child_env)
    if rec["rc"] == 0 and result.exists():
        sf = json.loads(result.read_text())
        points, e2e = sf_progress(Path(sf["sf_log"]).read_text(errors="replace"))
        rec["fps"], rec["fps_kind"] = frames_per_second(points, e2e)
        rec["greedy"], rec["sf"] = sf["eval"]["mean"], sf
    return rec


def main(argv: list[str]) -> int:
    argv, r2ac_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv \
        else (argv, [])  # fmt: skip
    p = argparse.ArgumentParser(
        prog="r2ac bench peer", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--envs", default="RepeatPreviousEasy", help="comma list of POPGym envs")
    p.add_argument("--seeds", default="5", help="'0-4', '0,3,7' or a count N (seeds 0..N-1)")
    p.add_argument("--frames", type=int, default=1_000_000, help="training frames a run")
    p.add_argument("--peer-mode", choices=("async", "serial"), default="async",
                   help="SF's normal asynchronous mode, or its serial mode (one process)")  # fmt: skip
    p.add_argument("--success", type=float, default=0.8, help=SUCCESS_HELP)
    p.add_argument("--sf-args", default="", help="more SF arguments, one string")
    p.add_argument("--peer-venv", type=Path, default=ROOT.parent / "peer-venv",
                   help="the peer's venv, created if missing (default: ../peer-venv)")  # fmt: skip
    p.add_argument("--peer-threads", type=int, default=1, help="torch threads of SF's learner")
    p.add_argument("--out-root", type=Path, help="where runs go (default runs/peer/<time>)")
    p.add_argument("--json-out", type=Path, help="every run and the table, as JSON")
    p.add_argument("--setup-only", action="store_true", help="create or check the venv, then stop")
    args = p.parse_args(argv)
    args.r2ac_args = r2ac_args
    check_args(args)  # before the venv is made or any run starts (ConfigError: one line)
    args.peer_python = setup_peer(args.peer_venv.resolve())
    if args.setup_only:
        print(f"peer venv ready: {args.peer_venv}")
        return 0
    envs, seeds = [short(e) for e in args.envs.split(",") if e], parse_seeds(args.seeds)
    root = args.out_root or ROOT / "runs" / "peer" / datetime.now().strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    records = []
    for env in envs:
        for seed in seeds:
            for system, run in (("r2ac", run_r2ac), ("sf", run_sf)):  # alternated
                out = root.resolve() / f"{env}-s{seed}-{system}"
                print(f"[peer] {system} {env} seed {seed} -> {out}", file=sys.stderr, flush=True)
                rec = {"system": system, "env": env, "seed": seed, "run_dir": str(out),
                       **run(args, env, seed, out)}  # fmt: skip
                records.append(rec)
                print(f"[peer]   rc {rec['rc']} greedy {rec.get('greedy')} frames/s "
                      f"{rec.get('fps')} wall {rec['wall_s']} s", file=sys.stderr, flush=True)  # fmt: skip
    labels = {"r2ac": "r2ac gru-bptt M=4 --preset popgym",
              "sf": f"Sample Factory {SF_VERSION} APPO GRU 128 ({args.peer_mode})"}  # fmt: skip
    rows = [summary(records, s, e, args.success) for e in envs for s in ("r2ac", "sf")]
    text = table(rows, labels, args.success)
    print(text)
    if args.json_out:
        doc = {"created": datetime.now().isoformat(timespec="seconds"), "argv": argv,
               "r2ac_args": r2ac_args, "peer_mode": args.peer_mode, "sf_args": args.sf_args,
               "frames": args.frames, "success": args.success, "cpus": os.cpu_count(),
               "summary": rows, "table": text, "runs": records}  # fmt: skip
        args.json_out.write_text(json.dumps(doc, indent=2))
        print(f"json: {args.json_out}")
    return 1 if any(r["rc"] != 0 or r.get("greedy") is None for r in records) else 0
