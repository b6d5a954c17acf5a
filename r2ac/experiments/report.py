"""Tables and learning curves of a grid, from its run directories (never from memory).

Table cells are the paper's format: the mean over seeds of each run's evaluation score
(itself the mean over K sets of E episodes, see r2ac.rl.run.evaluation) +- the std over seeds;
a missing run shows as "-" and a partial cell says how many seeds it holds. A second table
gives the training return over the last 10% of each run (sampled actions): greedy evaluation
can turn a policy that is uniform to within 0.1% into a perfect score (measured: feLSTM with
TBPTT, docs/results.md), and the two side by side show it. Curves are the mean over seeds of
the training return against frames, with a +-1 std band.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from r2ac.experiments.grids import Grid, RunSpec, Task
from r2ac.experiments.runner import check_overrides
from r2ac.experiments.runner import read_eval as eval_score
from r2ac.experiments.runner import read_eval_per_seed as eval_per_seed
from r2ac.rl.run.run_dir import read_metrics


def final_train_return(run_dir: Path, fraction: float = 0.1) -> float | None:
    """Mean training return (sampled actions) over the last `fraction` of the logged rows."""
    curve = curve_of(run_dir)
    if curve is None:
        return None
    returns = curve[1]
    return float(returns[-max(1, int(len(returns) * fraction)) :].mean())


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population std (the std of the seed means, as the paper reports)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std())


@dataclass
class Cell:
    """A table cell's values: one per seed, or one per lockstep run whose metric pools its
    seeds (the training return); `seeds`: how many seeds the values cover."""

    values: list[float] = field(default_factory=list)
    seeds: int = 0


def collect(specs: list[RunSpec], out: Path, metric=eval_per_seed) -> dict[tuple[str, str], Cell]:
    """(task name, variant label) -> `metric` of each finished run directory: a list is one
    value per seed of the run (a lockstep run's agents), a number one value for the run."""
    cells: dict[tuple[str, str], Cell] = {}
    for spec in specs:
        run_dir = out / "runs" / spec.run_id
        cell = cells.setdefault((spec.task.name, spec.variant.label), Cell())
        score = metric(run_dir) if (run_dir / "eval.json").exists() else None  # finished runs only
        if score is None:
            continue
        if isinstance(score, list):  # one value per seed
            cell.values += score
            cell.seeds += len(score)
        else:  # one value for the run, pooled over its seeds
            cell.values.append(score)
            cell.seeds += spec.agents
    return cells


def format_cell(values: list[float], seeds: int, covered: int | None = None) -> str:
    """mean ± std over seeds, then each seed's value; `covered` (default: one value per seed)
    the seeds the values cover, more than there are values when a lockstep run's value pools
    its seeds."""
    if not values:
        return "-"
    covered = len(values) if covered is None else covered
    mean, std = mean_std(values)
    partial = "" if covered == seeds else f"{covered}/{seeds} seeds"
    if covered != len(values):
        return f"{mean:.3f} (pooled over {partial or f'{covered} seeds'})"
    each = [" / ".join(f"{v:.3f}" for v in values)] if len(values) > 1 else []
    return f"{mean:.3f} ± {std:.3f}" + "".join(f" ({x})" for x in [*each, partial] if x)


def success_cell(values: list[float], seeds: int, threshold: float) -> str:
    """Seeds at or above `threshold` out of those finished, and each seed's score."""
    if not values:
        return "-"
    ok = sum(v >= threshold for v in values)
    partial = "" if len(values) == seeds else f", {len(values)}/{seeds} seeds"
    return f"{ok}/{len(values)} ({', '.join(f'{v:.2f}' for v in values)}{partial})"


def successes(values: list[float], threshold: float | None) -> str:
    """ "; k/N >= t" for a column with a success threshold, "" otherwise."""
    if threshold is None or not values:
        return ""
    return f"; {sum(v >= threshold for v in values)}/{len(values)} >= {threshold:.2f}"


def suite_cell(per_task: list[list[float]], score_map) -> str:
    """Mean over tasks of each task's mapped seed mean; "-" unless every task has a run."""
    if not all(per_task):
        return "-"
    mapped = [score_map(float(np.mean(values))) for values in per_task]
    partial = "" if len({len(v) for v in per_task}) == 1 else " (seeds differ by task)"
    return f"{float(np.mean(mapped)):.3f}{partial}"


def markdown_table(
    grid: Grid,
    tasks: tuple[Task, ...],
    specs: list[RunSpec],
    out: Path,
    seeds: int,
    metric=eval_per_seed,
    notes: bool = True,
    threshold: float | None = None,
) -> str:
    """The grid's table: mean ± std over seeds per cell, or with `threshold` the seeds whose
    score reaches it (success_cell)."""
    scores = collect(specs, out, metric)
    suite = grid.suite_score is not None and len(tasks) > 1 and threshold is None
    names = [t.name for t in tasks] + (["suite (normalised)"] if suite else [])
    lines = ["| model | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for v in grid.variants:
        per_task = [scores.get((t.name, v.label), Cell()) for t in tasks]
        if threshold is not None:
            cells = [success_cell(c.values, seeds, threshold) for c in per_task]
        else:
            cells = [
                format_cell(c.values, seeds, c.seeds) + successes(c.values, t.success_at)
                for c, t in zip(per_task, tasks, strict=True)
            ]
        if suite:
            cells.append(suite_cell([c.values for c in per_task], grid.suite_score))
        lines.append(f"| {v.label} | " + " | ".join(cells) + " |")
    task_notes = [f"- {t.note}" for t in tasks if t.note] if notes else []
    return "\n".join(lines + ([""] + task_notes if task_notes else []))


def curve_of(run_dir: Path, column: str = "return_mean") -> tuple[np.ndarray, np.ndarray] | None:
    """(frames, column) of a run's metrics.csv, rows where the column is empty (the training
    return before the first episode ends) dropped; None without such rows."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return None
    rows = [r for r in read_metrics(path) if not math.isnan(r.get(column, math.nan))]
    if not rows:
        return None
    return (
        np.array([r["frames"] for r in rows], dtype=np.float64),
        np.array([r[column] for r in rows], dtype=np.float64),
    )


def mean_curve(curves: list[tuple[np.ndarray, np.ndarray]], points: int = 100):
    """Seeds interpolated onto a common frame grid (up to the shortest run): x, mean, std."""
    end = min(c[0][-1] for c in curves)
    start = max(c[0][0] for c in curves)
    x = np.linspace(start, end, points) if end > start else np.array([end])
    ys = np.stack([np.interp(x, f, r) for f, r in curves])
    return x, ys.mean(0), ys.std(0)


def plot_curves(grid: Grid, tasks: tuple[Task, ...], specs: list[RunSpec], out: Path) -> list[Path]:
    """One PNG per task: mean training return vs frames per variant, with a std band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for task in tasks:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        drawn = 0
        for v in grid.variants:
            runs = [s for s in specs if s.task.name == task.name and s.variant.label == v.label]
            # frames per seed: a lockstep run's frames count every agent's steps
            drawn_runs = [
                (s, (c[0] / s.agents, c[1]))
                for s in runs
                if (c := curve_of(out / "runs" / s.run_id))
            ]
            if not drawn_runs:
                continue
            x, mean, std = mean_curve([c for _, c in drawn_runs])
            seeds = sum(s.agents for s, _ in drawn_runs)
            pooled = " pooled" if any(s.agents > 1 for s, _ in drawn_runs) else ""
            (line,) = ax.plot(x, mean, label=f"{v.label} ({seeds} seeds{pooled})")
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            drawn += 1
        if drawn:
            ax.set_xlabel("frames (per seed)")
            ax.set_ylabel("training return (mean over seeds ± std)")
            ax.set_title(f"{grid.name}: {task.name}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            path = out / f"curves_{task.name}.png"
            fig.savefig(path, dpi=110)
            written.append(path)
        plt.close(fig)
    return written


def eval_protocol(task: Task) -> str:
    """How a column's runs are evaluated, e.g. "seaquest-cpu: 5 sets x 30 episodes, sampled"."""
    cfg = check_overrides(task.preset, task.overrides)
    mode = "greedy" if cfg.run.eval_greedy else "sampled"
    return f"{task.name}: {cfg.run.eval_sets} sets x {cfg.run.eval_episodes} episodes, {mode}"


def write_report(
    grid: Grid, tasks: tuple[Task, ...], specs: list[RunSpec], out: Path, seeds: int, header: str
) -> tuple[Path, str]:
    """OUT/results.md (the tables, notes, curves) and OUT/results.json (every run's scores).
    Returns the path of results.md and the evaluation table."""
    table = markdown_table(grid, tasks, specs, out, seeds)
    train = markdown_table(grid, tasks, specs, out, seeds, final_train_return, notes=False)
    lockstep = [
        "Lockstep rows (one run of all seeds, `--num-agents`): each seed's score is its "
        "agent's (eval.json `agents`); the training return and curves pool the agents.",
        "",
    ]
    solved = []
    if grid.success_threshold is not None:
        solved = [
            f"Solved (evaluation score >= {grid.success_threshold:g}): seeds out of those "
            "finished, with each seed's score:",
            "",
            markdown_table(
                grid, tasks, specs, out, seeds, notes=False, threshold=grid.success_threshold
            ),
            "",
        ]
    images = plot_curves(grid, tasks, specs, out)
    body = [
        f"# {grid.name}",
        "",
        grid.description,
        "",
        header,
        "",
        "Evaluation (mean ± std over seeds of each run's mean score; per column: "
        + "; ".join(eval_protocol(t) for t in tasks)
        + "):",
        "",
        table,
        "",
        *solved,
        *(lockstep if any(s.agents > 1 for s in specs) else []),
        "Training return over the last 10% of each run (sampled actions):",
        "",
        train,
        "",
    ]
    body += [f"![{p.stem}]({p.name})" for p in images]
    path = out / "results.md"
    path.write_text("\n".join(body) + "\n")
    runs = {
        s.run_id: {
            "task": s.task.name,
            "variant": s.variant.label,
            "seed": s.seed,
            "seeds": list(s.seeds),
            "eval_mean": eval_score(out / "runs" / s.run_id),
            "eval_per_seed": eval_per_seed(out / "runs" / s.run_id),
            "final_train_return": final_train_return(out / "runs" / s.run_id),
        }
        for s in specs
    }
    (out / "results.json").write_text(
        json.dumps({"grid": grid.name, "runs": runs}, indent=2) + "\n"
    )
    return path, table
