"""`r2ac eval RUN_DIR [--sets K] [--episodes E] [--greedy | --sampled] [--seed S]`: the
evaluation protocol (r2ac/rl/run/evaluation.py: K seeded sets of E complete episodes; mean of
set means and std) on a finished or stopped run, as its trainer saved it (a batched run:
checkpoints/agent.pt; a streaming run: its last checkpoint, with the normalisers); writes
RUN_DIR/eval.json. A module the run's config names (`gym/MODULE:ID`) is imported only with
`--env gym/MODULE:ID` or `--trust-env-module` (a run directory is data; r2ac/envs/trust.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from r2ac.envs.trust import NO_TRUST, TRUST_FLAG, TrustRequest
from r2ac.errors import (
    ConfigError,
    MissingDependencyError,
    check_writable,
    naming_file,
    write_failure_line,
)
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
    env_trust: TrustRequest = NO_TRUST,
) -> tuple[dict, Path]:
    run = RunDir.open(path)
    cfg = validate(run.config())
    env_trust.apply(cfg.env.id, "r2ac eval")  # before anything imports the env
    check_writable(out or run.eval_path, "--out", is_file=True)
    protocol = (
        sets or cfg.run.eval_sets,
        episodes or cfg.run.eval_episodes,
        cfg.run.eval_greedy if greedy is None else greedy,
        seed,
    )
    result = _evaluate_saved(run, cfg, protocol)
    return result, write_eval(run, result, out)


def _evaluate_saved(run: RunDir, cfg, protocol) -> dict:
    """The trainer's evaluation of what the run saved; a saved value that does not fit (a
    damaged RNG or env state) is one ConfigError naming the file, as `--resume` says it."""
    path = run.checkpoint_path
    try:
        return trainer_class(cfg).evaluate_saved(run, cfg, *protocol)
    except ConfigError as exc:
        raise naming_file(exc, path, run.config_path) from exc
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
        detail = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"{path}: malformed training checkpoint ({type(exc).__name__}: {detail})"
        ) from exc


def check_args(args: argparse.Namespace) -> None:
    """ConfigError for counts out of 1..their bound, or a seed out of 0..2**63-1."""
    bounds = {"sets": MAX_EVAL_SETS, "episodes": MAX_EVAL_EPISODES}
    for name, bound in bounds.items():
        value = getattr(args, name)
        if value is not None and not 1 <= value <= bound:
            raise ConfigError(f"--{name} must be in 1..{bound:,}, got {value:,}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed must be in 0..2**63-1, got {args.seed}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="r2ac eval", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sets", type=int, help="K (default: the run's eval_sets)")
    parser.add_argument("--episodes", type=int, help="E (default: the run's eval_episodes)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="greedy", action="store_true", default=None)
    mode.add_argument("--sampled", dest="greedy", action="store_false")
    parser.add_argument("--seed", type=int, help="evaluation seed (default: the run's seed)")
    parser.add_argument(
        "--env",
        dest="env_named",
        metavar="ENV",
        help="the run's env, confirming that its module (gym/MODULE:ID) may be imported",
    )
    parser.add_argument(
        TRUST_FLAG,
        dest="trust_env_module",
        action="store_true",
        help="import the module the run's config names (gym/MODULE:ID) without naming it",
    )
    parser.add_argument(
        "--out",
        help="result file (default RUN_DIR/eval.json; give another to "
        "keep the run's own evaluation, e.g. a --sampled check of a greedy run)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        check_args(args)
        env_trust = TrustRequest(args.env_named, args.trust_env_module)
        result, path = evaluate_run(
            args.run_dir, args.sets, args.episodes, args.greedy, args.seed, args.out, env_trust
        )
    except (ConfigError, MissingDependencyError) as exc:
        print(f"r2ac eval: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk (or file size limit) after the up-front probe
        line = write_failure_line(exc)
        if line is None:
            raise
        print(f"r2ac eval: error: {line} (the run directory is unchanged)", file=sys.stderr)
        return 1
    print(
        f"{result['env']} {result['core']}: {result['mean']:.3f} +- {result['std']:.3f} "
        f"({result['sets']} x {result['episodes_per_set']} {result['actions']} episodes, "
        f"{result['seconds']:.1f} s) -> {path}"
    )
    return 0
