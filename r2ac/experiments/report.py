"""Tables and learning curves of a grid, from its run directories (never from memory).

Table cells are the paper's format: the mean over seeds of each run's evaluation score
(itself the mean over K sets of E episodes, see r2ac.rl.harness.evaluate) +- the std over seeds;
a missing run shows as "-" and a partial cell says how many seeds it holds. A second table
gives the training return over the last 10% of each run (sampled actions): greedy evaluation
can turn a policy that is uniform to within 0.1% into a perfect score (measured: feLSTM with
TBPTT, docs/results.md), and the two side by side show it. Curves are the mean over seeds of
the training return against frames, with a +-1 std band.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from r2ac.experiments.grids import Grid, RunSpec, Task
from r2ac.experiments.runner import check_overrides
from r2ac.experiments.runner import read_eval as eval_score
from r2ac.rl.harness.run_dir import read_metrics


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


def collect(
    specs: list[RunSpec], out: Path, metric=eval_score
) -> dict[tuple[str, str], list[float]]:
    """(task name, variant label) -> `metric` of each finished seed's run directory."""
    scores: dict[tuple[str, str], list[float]] = {}
    for spec in specs:
        run_dir = out / "runs" / spec.run_id
        score = metric(run_dir) if (run_dir / "eval.json").exists() else None  # finished runs only
        key = (spec.task.name, spec.variant.label)
        scores.setdefault(key, [])
        if score is not None:
            scores[key].append(score)
    return scores


def format_cell(values: list[float], seeds: int) -> str:
    if not values:
        return "-"
    mean, std = mean_std(values)
    partial = "" if len(values) == seeds else f" ({len(values)}/{seeds} seeds)"
    return f"{mean:.3f} ± {std:.3f}{partial}"


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
    metric=eval_score,
    notes: bool = True,
) -> str:
    scores = collect(specs, out, metric)
    suite = grid.suite_score is not None and len(tasks) > 1
    names = [t.name for t in tasks] + (["suite (normalised)"] if suite else [])
    lines = ["| model | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for v in grid.variants:
        per_task = [scores.get((t.name, v.label), []) for t in tasks]
        cells = [format_cell(values, seeds) for values in per_task]
        if suite:
            cells.append(suite_cell(per_task, grid.suite_score))
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
            curves = [c for c in (curve_of(out / "runs" / s.run_id) for s in runs) if c]
            if not curves:
                continue
            x, mean, std = mean_curve(curves)
            (line,) = ax.plot(x, mean, label=f"{v.label} ({len(curves)} seeds)")
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            drawn += 1
        if drawn:
            ax.set_xlabel("frames")
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
    mode = "greedy" if cfg.study.eval_greedy else "sampled"
    return f"{task.name}: {cfg.run.eval_sets} sets x {cfg.run.eval_episodes} episodes, {mode}"


def write_report(
    grid: Grid, tasks: tuple[Task, ...], specs: list[RunSpec], out: Path, seeds: int, header: str
) -> tuple[Path, str]:
    """OUT/results.md (the tables, notes, curves) and OUT/results.json (every run's scores).
    Returns the path of results.md and the evaluation table."""
    table = markdown_table(grid, tasks, specs, out, seeds)
    train = markdown_table(grid, tasks, specs, out, seeds, final_train_return, notes=False)
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
            "eval_mean": eval_score(out / "runs" / s.run_id),
            "final_train_return": final_train_return(out / "runs" / s.run_id),
        }
        for s in specs
    }
    (out / "results.json").write_text(
        json.dumps({"grid": grid.name, "runs": runs}, indent=2) + "\n"
    )
    return path, table
