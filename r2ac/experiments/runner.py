"""Run the training runs of a grid as `r2ac train` subprocesses, J at a time, resumably.

Each run lives in OUT/runs/<run_id>/ (a normal run directory: config, metrics, checkpoints,
eval.json) with its log next to it in OUT/logs/<run_id>.log. What exists decides what to do:

    eval.json present                    finished: skipped
    checkpoints/latest.pt present        interrupted: `r2ac train --resume` (exact for serial)
    config.json only                     stopped before its first checkpoint: `--restart`
    anything else                        started afresh

so re-running the same command after a crash or Ctrl-C only redoes what is missing. A run
directory whose saved config differs from what the grid now asks for (the grid was edited
since) is "stale": the command refuses to start rather than mix old runs into a new table.
Subprocesses keep one run's failure from taking the grid down and let J runs use J cores.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2ac.experiments.grids import RunSpec
from r2ac.rl.config import TrainConfig, preset, validate
from r2ac.rl.run_dir import RunDir

# Config fields that belong to where and how a run is shown, not to what it computes.
_PLACEMENT_FIELDS = frozenset({"out_dir", "progress"})


@dataclass
class RunResult:
    spec: RunSpec
    status: str  # "done" (already finished), "ran", "failed"
    seconds: float = 0.0
    eval_mean: float | None = None
    message: str = ""


def train_args(overrides: dict[str, Any]) -> list[str]:
    """`r2ac train` flags for TrainConfig overrides (tyro's spelling: --field-name VALUE)."""
    args: list[str] = []
    for name, value in overrides.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, (tuple, list)):
            args += [flag, *map(str, value)] if value else [flag]
        else:
            args += [flag, "None" if value is None else str(value)]
    return args


def check_overrides(preset_name: str, overrides: dict[str, Any]) -> TrainConfig:
    """The resolved config of a run; raises ConfigError before anything is started."""
    return validate(dataclasses.replace(preset(preset_name), **overrides))


def config_mismatch(run_dir: Path, expected: TrainConfig) -> list[str]:
    """Fields whose saved value in run_dir/config.json differs from `expected` ([] if none saved).

    The saved config is read as `r2ac train --resume` reads it: a field the run predates
    takes its default.
    """
    run = RunDir(run_dir)
    if not run.config_path.exists():
        return []
    saved = run.config()
    return [
        f.name
        for f in dataclasses.fields(TrainConfig)
        if f.name not in _PLACEMENT_FIELDS and getattr(saved, f.name) != getattr(expected, f.name)
    ]


def run_state(run_dir: Path) -> str:
    """'finished', 'interrupted' (resumable) or 'new'."""
    if (run_dir / "eval.json").exists():
        return "finished"
    if (run_dir / "checkpoints" / "latest.pt").exists():
        return "interrupted"
    return "new"


def command_for(spec: RunSpec, run_dir: Path, total_frames: int | None) -> list[str]:
    base = [sys.executable, "-m", "r2ac.cli", "train"]
    if run_state(run_dir) == "interrupted":
        return [*base, "--resume", str(run_dir)]
    if (run_dir / "config.json").exists():  # the run dir's lock guards it, unlike a removal
        return [*base, "--restart", str(run_dir)]
    return [
        *base,
        "--preset",
        spec.task.preset,
        *train_args(spec.overrides(total_frames)),
        "--out-dir",
        str(run_dir),
        "--no-progress",
    ]


def read_eval(run_dir: Path) -> float | None:
    path = run_dir / "eval.json"
    return float(json.loads(path.read_text())["mean"]) if path.exists() else None


def run_one(spec: RunSpec, out: Path, total_frames: int | None) -> RunResult:
    """Train (or resume) one run to its eval.json; its output goes to OUT/logs/<id>.log."""
    run_dir = out / "runs" / spec.run_id
    if run_state(run_dir) == "finished":
        return RunResult(spec, "done", eval_mean=read_eval(run_dir))
    log_path = out / "logs" / f"{spec.run_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = command_for(spec, run_dir, total_frames)
    start = time.perf_counter()
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or run_state(run_dir) != "finished":
        return RunResult(
            spec, "failed", seconds, message=f"exit code {proc.returncode}; see {log_path}"
        )
    return RunResult(spec, "ran", seconds, eval_mean=read_eval(run_dir))


def run_grid(
    specs: list[RunSpec],
    out: Path,
    jobs: int,
    total_frames: int | None = None,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every spec (finished ones are skipped), `jobs` at a time; results in spec order."""
    results: dict[str, RunResult] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_one, s, out, total_frames): s for s in specs}
        for future in as_completed(futures):
            result = future.result()
            results[result.spec.run_id] = result
            if on_result is not None:
                on_result(result)
    return [results[s.run_id] for s in specs]
