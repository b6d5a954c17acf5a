"""`r2ac experiment NAME [--seeds K] [--jobs J] [--out DIR] [--tasks ...] [--unroll-lengths M ...]
[--difficulty easy|medium|hard] [--total-frames F]`.

Runs a named grid (r2ac.experiments.grids: memory-m, ablation, reactive, popgym,
stream-memory-chain, stream-q-memory-chain, stream-popgym) with the trainer,
evaluates every run with the paper's protocol, and writes OUT/results.md (table: mean +- std
over seeds, learning curves as PNG) and OUT/results.json. Resumable: re-running the same
command skips finished runs and resumes interrupted ones; Ctrl-C stops the running ones at
their next update, each with a checkpoint (one line, exit 130). `r2ac experiment cost` is an
alias of `r2ac bench cost` (r2ac.bench.cost, the cost study). `--dry-run` lists the runs.
"""

from __future__ import annotations

import datetime
import importlib
import json
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from r2ac.errors import ConfigError, check_writable
from r2ac.experiments import grids, report, runner
from r2ac.runs.stop import exit_code, signal_name


@dataclass(frozen=True)
class ExperimentConfig:
    """Options of `r2ac experiment NAME`."""

    seeds: int | None = None
    """Training seeds per cell (default: the grid's, 3)."""
    jobs: int = 1
    """Runs trained at the same time (each is one process on one core)."""
    out: str | None = None
    """Output directory (default runs/experiments/NAME)."""
    tasks: tuple[str, ...] = ()
    """Only these tasks (table columns) of the grid (default: all)."""
    unroll_lengths: tuple[int, ...] = ()
    """Only the rows (variants) with these segment lengths M (default: all)."""
    cores: tuple[str, ...] = ()
    """Only the rows (variants) with these cores, e.g. elstm-rtrl elstm-bptt (default: all)."""
    difficulty: Literal["easy", "medium", "hard"] | None = None
    """Difficulty of the grid's envs (popgym: POPGym's Easy, Medium or Hard ids; default easy).
    Task names get a -medium / -hard suffix, so the levels' runs never share a directory."""
    total_frames: int | None = None
    """Override every run's training frames (e.g. a short slice); saved in experiment.json."""
    dry_run: bool = False
    """List the runs and their state, train nothing."""
    report_only: bool = False
    """Only rewrite results.md / PNGs from the run directories that exist."""


def _usage() -> str:
    names = [*grids.GRIDS, *grids.STUDIES]
    pad = max(len(n) for n in names)
    lines = [f"  {g.name:<{pad}} {g.description}" for g in grids.GRIDS.values()]
    lines += [f"  {'cost':<{pad}} learner memory and update time against M (App. B.3)"]
    return (
        "usage: r2ac experiment {"
        + ",".join(names)
        + "} [options]   (--help per experiment)\n\n"
        + "\n".join(lines)
    )


def _header(name: str, seeds: int, argv: list[str]) -> str:
    from r2ac.runs.locked_dir import git_revision, machine

    box = machine()
    return (
        f"Command: `r2ac experiment {name} {shlex.join(argv)}`. Machine: {box['cpu']} "
        f"({box['cpu_capability']}), {box['cpu_count']} CPUs, torch {box['torch']}; "
        f"git {git_revision()[:10]}; "
        f"{seeds} seeds per cell; report written {datetime.datetime.now():%Y-%m-%d %H:%M}."
    )


def _validate(
    specs: list[grids.RunSpec], total_frames: int | None, out: Path
) -> dict[str, list[str]]:
    """Validate every run's config before starting any (unknown core, bad sizes, ...).

    Returns the stale runs: run_id -> fields where the existing run directory's config
    differs from the grid's (the grid was edited since that run).
    """
    stale = {}
    for spec in specs:
        expected = runner.check_overrides(spec.preset, spec.overrides(total_frames))
        fields = runner.config_mismatch(out / "runs" / spec.run_id, expected)
        if fields:
            stale[spec.run_id] = fields
    return stale


def _refuse_stale(stale: dict[str, list[str]], out: Path) -> None:
    if not stale:
        return
    listed = "; ".join(f"{run_id} ({', '.join(f)})" for run_id, f in list(stale.items())[:5])
    more = f" and {len(stale) - 5} more" if len(stale) > 5 else ""
    raise ConfigError(
        f"{len(stale)} run directories under {out / 'runs'} hold a different config than the "
        f"grid now asks for (field names in brackets): {listed}{more}. Move them away or use "
        "another --out; nothing was started."
    )


def _save_meta(out: Path, name: str, cfg: ExperimentConfig, seeds: int, argv: list[str]) -> None:
    """experiment.json: the options; a resumed grid must use the same run settings."""
    meta_path = out / "experiment.json"
    meta = {
        "experiment": name,
        "seeds": seeds,
        "tasks": list(cfg.tasks),
        "unroll_lengths": list(cfg.unroll_lengths),
        "cores": list(cfg.cores),
        "difficulty": cfg.difficulty,
        "total_frames": cfg.total_frames,
        "argv": argv,
    }
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old.get("total_frames") != cfg.total_frames:
            raise ConfigError(
                f"{out} was run with --total-frames {old.get('total_frames')}, not "
                f"{cfg.total_frames}; use the same value or another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")


def run_experiment(name: str, cfg: ExperimentConfig, argv: list[str]) -> int:
    g = grids.select_difficulty(grids.grid(name), cfg.difficulty)
    g = grids.select_unroll_lengths(g, cfg.unroll_lengths)
    g = grids.select_cores(g, cfg.cores)
    seeds = cfg.seeds if cfg.seeds is not None else g.default_seeds
    tasks = grids.select_tasks(g, cfg.tasks)
    specs = grids.runs_of(g, seeds, tasks)
    out = Path(cfg.out or f"runs/experiments/{name}")
    if cfg.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {cfg.jobs}")
    check_writable(out, "--out")
    stale = _validate(specs, cfg.total_frames, out)
    if cfg.dry_run:
        for spec in specs:
            state = (
                "stale" if spec.run_id in stale else runner.run_state(out / "runs" / spec.run_id)
            )
            print(f"{state:<12} {spec.run_id}")
        return 0
    _refuse_stale(stale, out)
    if not cfg.report_only:
        _save_meta(out, name, cfg, seeds, argv)
        _train(specs, out, cfg)
    path, table = report.write_report(g, tasks, specs, out, seeds, _header(name, seeds, argv))
    print(table)
    print(f"\nwritten: {path}")
    return 0


def _train(specs: list[grids.RunSpec], out: Path, cfg: ExperimentConfig) -> None:
    from tqdm import tqdm

    failed = []
    with tqdm(total=len(specs), desc="runs", unit="run", file=sys.stderr) as bar:

        def on_result(result: runner.RunResult) -> None:
            bar.update(1)
            score = "-" if result.eval_mean is None else f"{result.eval_mean:.3f}"
            bar.write(
                f"{result.status:<7} {result.spec.run_id}  eval {score}  "
                f"{result.seconds:.0f} s {result.message}"
            )
            if result.status == "failed":
                failed.append(result)

        runner.run_grid(specs, out, cfg.jobs, cfg.total_frames, on_result)
    if failed:
        print(
            f"{len(failed)} run(s) failed; their logs are in {out / 'logs'}; re-run the "
            "same command to retry them",
            file=sys.stderr,
        )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    try:
        if name in grids.STUDIES:
            return int(importlib.import_module(grids.STUDIES[name]).main(rest) or 0)
        grids.grid(name)  # unknown name: a clear error before tyro sees the options
        import tyro

        cfg = tyro.cli(
            ExperimentConfig,
            args=rest,
            prog=f"r2ac experiment {name}",
            description=grids.GRIDS[name].description,
        )
        return run_experiment(name, cfg, rest)
    except ConfigError as exc:
        print(f"r2ac experiment: error: {exc}", file=sys.stderr)
        return 2
    except runner.GridStopped as stop:
        print(
            f"r2ac experiment: stopped by {signal.Signals(stop.signum).name}: "
            f"{stop.summary()}; re-run the same command to resume",
            file=sys.stderr,
        )
        return stop.exit_code
    except KeyboardInterrupt as exc:  # before any run started: nothing to stop
        print(
            f"r2ac experiment: stopped by {signal_name(exc)}; re-run the same command to resume",
            file=sys.stderr,
        )
        return exit_code(exc)


__all__ = ["ExperimentConfig", "main", "run_experiment"]
