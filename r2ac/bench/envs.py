"""`r2ac bench envs`: environment steps per second per env family at a few batch sizes.

Random actions (drawn before timing), auto-reset included, one process. Families whose
backend is missing are listed as skipped with the reason. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from r2ac.envs import make, trust
from r2ac.errors import ConfigError

# One representative env per family.
DEFAULT_ENVS = (
    "builtin/delayed-cue",
    "builtin/watermaze",
    "atari/Breakout",
    "procgen/chaser",
    "minigrid/MemoryS13Random",
    "gym/popgym-RepeatPreviousEasy-v0",
    "dmlab/rooms_watermaze",
)


def steps_per_second(name: str, num_envs: int, seconds: float, seed: int = 0) -> float:
    """Env steps (summed over the batch) per wall-clock second after a short warm-up."""
    env = make(name, num_envs, seed)
    try:
        env.reset()
        actions = np.random.default_rng(seed).integers(0, env.num_actions, (256, num_envs))
        for row in actions[:8]:
            env.step(row)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.step(actions[steps % len(actions)])
            steps += 1
        return steps * num_envs / (time.perf_counter() - start)
    finally:
        env.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="r2ac bench envs", description=__doc__)
    parser.add_argument(
        "--envs",
        nargs="+",
        default=list(DEFAULT_ENVS),
        help="env names (one per family by default)",
    )
    parser.add_argument(
        "--batch-sizes",
        nargs="+",
        type=int,
        default=[1, 16, 64, 256],
        help="numbers of streams per batch",
    )
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="timed seconds per (env, batch size) cell"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not (0 < args.seconds <= 3600):
        print(
            f"r2ac bench envs: --seconds must be in (0, 3600], got {args.seconds}", file=sys.stderr
        )
        return 2
    if not all(1 <= b <= 65_536 for b in args.batch_sizes):
        print(
            f"r2ac bench envs: --batch-sizes must be in 1..65536, got {args.batch_sizes}",
            file=sys.stderr,
        )
        return 2
    print("| env | " + " | ".join(f"B={b}" for b in args.batch_sizes) + " |")
    print("|---|" + "---:|" * len(args.batch_sizes))
    for name in args.envs:
        try:
            trust.allow_env(name)  # named on the command line: its module may be imported
            cells = [f"{steps_per_second(name, b, args.seconds):,.0f}" for b in args.batch_sizes]
        except (ImportError, ConfigError) as exc:
            print(f"| {name} | skipped: {str(exc).splitlines()[0][:100]} |")
            continue
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0
