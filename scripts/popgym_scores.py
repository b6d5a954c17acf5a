"""Reference scores of the POPGym envs of `r2ac experiment popgym`: a uniformly random policy
and, where r2ac.envs.scripted has one, the oracle that reads the hidden state.

    python scripts/popgym_scores.py [--episodes-per-stream 25] [--streams 8]

Prints a Markdown table (mean +- standard error over streams x episodes). POPGym scales
every env's return to [-1, 1] with the optimum at +1 (Morad et al. 2023).
"""

from __future__ import annotations

import argparse
import warnings

from r2ac.envs import make
from r2ac.envs.scripted import POPGYM_ORACLES, evaluate, popgym_oracle_policy, random_policy
from r2ac.experiments.grids import POPGYM_TASKS


def scores(env_name: str, streams: int, episodes: int, seed: int) -> tuple[str, str]:
    env = make(env_name, streams, seed)
    mean, err = evaluate(env, random_policy(env.action_space, seed), episodes, seed)
    random_cell = f"{mean:.3f} ± {err:.3f}"
    oracle_cell = "-"
    if any(f"popgym-{game}" in env_name for game in POPGYM_ORACLES):
        env = make(env_name, streams, seed)
        mean, err = evaluate(env, popgym_oracle_policy(env), episodes, seed)
        oracle_cell = f"{mean:.3f} ± {err:.3f}"
    return random_cell, oracle_cell


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--episodes-per-stream", type=int, default=25)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module=r"gymnasium\..*")
    print("| task | env | random | oracle |")
    print("|---|---|---:|---:|")
    for task in POPGYM_TASKS:
        env_name = task.overrides["env"]
        random_cell, oracle_cell = scores(
            env_name, args.streams, args.episodes_per_stream, args.seed
        )
        print(f"| {task.name} | {env_name} | {random_cell} | {oracle_cell} |", flush=True)


if __name__ == "__main__":
    main()
