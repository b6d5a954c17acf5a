"""The uniform random policy's score on an env, by r2ac's evaluation protocol.

    r2ac bench random-policy gym/popgym-BattleshipEasy-v0 [--sets 3] [--episodes 100]

The reference row beside trained agents ("random"): the agent of `--preset popgym` for the env
with its policy layer zeroed, so every categorical (Discrete, each MultiDiscrete component,
MultiBinary's Bernoullis) is uniform, and actions are sampled; `r2ac.rl.run.evaluation.evaluate`
plays the same seeded sets of episodes as `r2ac eval` does. Box actions are refused: a zero
policy layer gives a standard Gaussian, not a uniform policy. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from r2ac.envs import trust
from r2ac.errors import ConfigError, MissingDependencyError
from r2ac.rl.config import validate
from r2ac.rl.harness.evaluate import check_args
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.presets import PRESETS
from r2ac.rl.run.evaluation import evaluate


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="r2ac bench random-policy", description=__doc__.splitlines()[0]
    )
    p.add_argument("env", help="an env id as `r2ac train --env` takes it")
    p.add_argument("--sets", type=int, default=3)
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        check_args(args)  # r2ac eval's bounds
        trust.allow_env(args.env)  # named on the command line: its module may be imported
        cfg = validate(PRESETS["popgym"].updated(env=args.env, core="feedforward", seed=args.seed))
        env = make_env(cfg, 1, 0)
    except (ConfigError, MissingDependencyError) as exc:
        print(f"r2ac bench random-policy: error: {exc}", file=sys.stderr)
        return 2
    agent = agent_for_env(cfg, env)
    env.close()
    if agent.action_space.kind == "box":
        print(f"{args.env}: Box actions have no uniform policy here", file=sys.stderr)
        return 2
    with torch.no_grad():
        agent.heads.policy.weight.zero_()
        agent.heads.policy.bias.zero_()
    result = evaluate(agent, cfg, args.sets, args.episodes, greedy=False)
    result.pop("returns")
    result.update(core="random (uniform)", actions="uniform")
    print(json.dumps(result))
    return 0
