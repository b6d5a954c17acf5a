"""Run the training runs of a grid as `r2ac train` subprocesses, J at a time, resumably.

Each run lives in OUT/runs/<run_id>/ (a normal run directory: config, metrics, checkpoints,
eval.json) with its log next to it in OUT/logs/<run_id>.log. What exists decides what to do:

    eval.json present                    finished: skipped
    checkpoints/latest.pt present        interrupted: `r2ac train --resume` (exact for serial)
    config.json only                     stopped before its first checkpoint: `--restart`
    anything else                        started afresh

so re-running the same command after a crash or Ctrl-C only redoes what is missing. Ctrl-C
(SIGINT) or SIGTERM: no new run starts, every running child is stopped (it finishes its
update and writes a checkpoint), one line, exit 130 / 143. A run
directory whose saved config differs from what the grid now asks for (the grid was edited
since) is "stale": the command refuses to start rather than mix old runs into a new table.
Subprocesses keep one run's failure from taking the grid down and let J runs use J cores.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from r2ac.experiments.grids import RunSpec
from r2ac.rl.config import TrainConfig, validate
from r2ac.rl.presets import preset, preset_for
from r2ac.rl.run.run_dir import RunDir
from r2ac.runs.stop import StopRequest

# Config fields that belong to where and how a run is shown, not to what it computes.
_PLACEMENT_FIELDS = frozenset({"out_dir", "progress"})
POLL_S = 0.1  # how often the scheduler looks for children that have exited


@dataclass
class RunResult:
    spec: RunSpec
    status: str  # "done" (already finished), "ran", "failed", "stopped" (on a signal)
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
    core = overrides.get("core", preset(preset_name).model.core)
    return validate(preset_for(preset_name, core).updated(**overrides))


def config_mismatch(run_dir: Path, expected: TrainConfig) -> list[str]:
    """Fields whose saved value in run_dir/config.json differs from `expected` ([] if none saved).

    The saved config is read as `r2ac train --resume` reads it: a field the run predates
    takes its default.
    """
    run = RunDir(run_dir)
    if not run.config_path.exists():
        return []
    saved, wanted = run.config().flat(), expected.flat()
    return [n for n in saved if n not in _PLACEMENT_FIELDS and saved[n] != wanted[n]]


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
        spec.preset,
        *train_args(spec.overrides(total_frames)),
        "--out-dir",
        str(run_dir),
        "--no-progress",
    ]


def read_eval(run_dir: Path) -> float | None:
    """A finished run's evaluation score (of lockstep agents: their mean); None if unfinished."""
    path = run_dir / "eval.json"
    return float(json.loads(path.read_text())["mean"]) if path.exists() else None


def read_eval_per_seed(run_dir: Path) -> list[float] | None:
    """Each seed's evaluation score of a finished run: the agents' of a lockstep run (eval.json's
    `agents`, in seed order), else the run's one score; None if unfinished."""
    path = run_dir / "eval.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    agents = sorted(data.get("agents") or [], key=lambda a: a["seed"])
    return [float(a["mean"]) for a in agents] if agents else [float(data["mean"])]


@dataclass
class Started:
    """A run whose `r2ac train` child is running, its output going to `log`."""

    spec: RunSpec
    proc: subprocess.Popen
    log: IO[str]
    log_path: Path
    start: float


def start_run(spec: RunSpec, out: Path, total_frames: int | None) -> RunResult | Started:
    """Start (or resume) one run's child, its output to OUT/logs/<id>.log; a finished run
    is not started (its RunResult, status "done")."""
    run_dir = out / "runs" / spec.run_id
    if run_state(run_dir) == "finished":
        return RunResult(spec, "done", eval_mean=read_eval(run_dir))
    log_path = out / "logs" / f"{spec.run_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = command_for(spec, run_dir, total_frames)
    log = open(log_path, "a")  # closed by finish_run, once the child has exited
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return Started(spec, proc, log, log_path, time.perf_counter())


def finish_run(run: Started, stopping: bool = False) -> RunResult:
    """The result of a child that has exited: "ran" if its run is finished; "stopped" if it
    ended while the grid was stopping (a re-run resumes it); else "failed"."""
    run.log.close()
    seconds = time.perf_counter() - run.start
    run_dir = run.log_path.parent.parent / "runs" / run.spec.run_id
    code = run.proc.returncode
    if code == 0 and run_state(run_dir) == "finished":
        return RunResult(run.spec, "ran", seconds, eval_mean=read_eval(run_dir))
    status = "stopped" if stopping else "failed"
    return RunResult(run.spec, status, seconds, message=f"exit code {code}; see {run.log_path}")


def run_one(spec: RunSpec, out: Path, total_frames: int | None) -> RunResult:
    """Train (or resume) one run to its eval.json; its output goes to OUT/logs/<id>.log."""
    started = start_run(spec, out, total_frames)
    if isinstance(started, RunResult):
        return started
    started.proc.wait()
    return finish_run(started)


class GridStopped(Exception):  # noqa: N818  (a stop, not an error)
    """The grid stopped on a signal: its children were stopped (each checkpoints and exits),
    no new run was started; `results` holds the runs that ended, `not_started` the rest."""

    def __init__(self, signum: int, results: list[RunResult], not_started: int):
        self.signum, self.results, self.not_started = signum, results, not_started
        super().__init__(f"{signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def summary(self) -> str:
        count = Counter(r.status for r in self.results)
        return (
            f"{count['ran'] + count['done']} runs finished, {count['stopped']} stopped (each "
            f"at its last checkpoint), {count['failed']} failed, {self.not_started} not started"
        )


def _stop_children(running: list[Started], sig: int) -> None:
    for run in running:
        if run.proc.poll() is None:
            run.proc.send_signal(sig)


def run_grid(
    specs: list[RunSpec],
    out: Path,
    jobs: int,
    total_frames: int | None = None,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every spec (finished ones are skipped), `jobs` at a time; results in spec order.

    On SIGINT / SIGTERM no run is started any more and each running child gets one SIGTERM
    (it finishes its update, checkpoints and exits; a Ctrl-C at a terminal reaches it too,
    and a repeated request is harmless); once all have exited, GridStopped is raised. A
    second Ctrl-C kills the children at once (they resume from their last checkpoint).
    """
    results: dict[str, RunResult] = {}
    queue, running = list(specs), []

    def ended(result: RunResult) -> None:
        results[result.spec.run_id] = result
        if on_result is not None and result.status != "stopped":
            on_result(result)

    with StopRequest() as stop:
        try:
            _schedule(queue, running, jobs, stop, ended, out, total_frames)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            _stop_children(running, signal.SIGKILL)
            for run in running:
                run.proc.wait()
                ended(finish_run(run, stopping=True))
            raise GridStopped(signal.SIGINT, list(results.values()), len(queue)) from None
    if stop.requested:
        raise GridStopped(stop.signum, list(results.values()), len(queue))
    return [results[s.run_id] for s in specs]


def _schedule(queue, running, jobs, stop, ended, out, total_frames) -> None:
    """Start runs from `queue` while fewer than `jobs` run, until all ended or a stop was
    requested and every child has exited."""
    signalled = False
    while running or (queue and not stop.requested):
        while queue and len(running) < jobs and not stop.requested:
            started = start_run(queue.pop(0), out, total_frames)
            if isinstance(started, RunResult):
                ended(started)
            else:
                running.append(started)
        if stop.requested and not signalled:
            _stop_children(running, signal.SIGTERM)
            signalled = True
        for run in [r for r in running if r.proc.poll() is not None]:
            running.remove(run)
            ended(finish_run(run, stopping=stop.requested))
        if running:
            time.sleep(POLL_S)
