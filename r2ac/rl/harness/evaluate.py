"""`r2ac eval RUN_DIR [--sets K] [--episodes E] [--greedy | --sampled] [--seed S]`: the
evaluation protocol (r2ac/rl/run/evaluation.py: K seeded sets of E complete episodes; mean of
set means and std) on a finished or stopped run, as its trainer saved it (a batched run:
checkpoints/agent.pt; a streaming run: its last checkpoint, with the normalisers); writes
RUN_DIR/eval.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from r2ac.errors import ConfigError, MissingDependencyError, check_writable
from r2ac.rl.config import MAX_EVAL_EPISODES, MAX_EVAL_SETS, validate
from r2ac.rl.harness.trainers import trainer_class
from r2ac.rl.run.evaluation import write_eval
from r2ac.rl.run.run_dir import RunDir


def evaluate_run(
    path: str,
    sets: int | None,
    episodes: int | None,
    greedy: bool | None,
    seed: int | None,
    out: str | None = None,
) -> tuple[dict, Path]:
    run = RunDir.open(path)
    cfg = validate(run.config())
    check_writable(out or run.eval_path, "--out", is_file=True)
    protocol = (
        sets or cfg.run.eval_sets,
        episodes or cfg.run.eval_episodes,
        cfg.run.eval_greedy if greedy is None else greedy,
        seed,
    )
    result = trainer_class(cfg).evaluate_saved(run, cfg, *protocol)
    return result, write_eval(run, result, out)


def check_args(args: argparse.Namespace) -> None:
    """ConfigError for counts out of 1..their bound, or a seed out of 0..2**63-1."""
    bounds = {"sets": MAX_EVAL_SETS, "episodes": MAX_EVAL_EPISODES}
    for name, bound in bounds.items():
        value = getattr(args, name)
        if value is not None and not 1 <= value <= bound:
            raise ConfigError(f"--{name} must be in 1..{bound:,}, got {value:,}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed must be in 0..2**63-1, got {args.seed}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="r2ac eval", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sets", type=int, help="K (default: the run's eval_sets)")
    parser.add_argument("--episodes", type=int, help="E (default: the run's eval_episodes)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="greedy", action="store_true", default=None)
    mode.add_argument("--sampled", dest="greedy", action="store_false")
    parser.add_argument("--seed", type=int, help="evaluation seed (default: the run's seed)")
    parser.add_argument(
        "--out",
        help="result file (default RUN_DIR/eval.json; give another to "
        "keep the run's own evaluation, e.g. a --sampled check of a greedy run)",
    )
    args = parser.parse_args(argv)
    try:
        check_args(args)
        result, path = evaluate_run(
            args.run_dir, args.sets, args.episodes, args.greedy, args.seed, args.out
        )
    except (ConfigError, MissingDependencyError) as exc:
        print(f"r2ac eval: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{result['env']} {result['core']}: {result['mean']:.3f} +- {result['std']:.3f} "
        f"({result['sets']} x {result['episodes_per_set']} {result['actions']} episodes, "
        f"{result['seconds']:.1f} s) -> {path}"
    )
    return 0
