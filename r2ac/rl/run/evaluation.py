"""The evaluation protocol: K seeded sets of E complete episodes; the mean of the set means and
their std. Set k uses env seed `eval_seed(seed, k)` (disjoint from the training actors' seeds).
Each of the min(E, 32) streams plays a fixed quota of consecutive episodes, so short episodes
are not over-represented. `r2ac eval` (r2ac/rl/harness/evaluate.py) and every trainer's
`evaluate` run it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from r2ac.rl.config import TrainConfig
from r2ac.rl.model.agent import Agent
from r2ac.rl.model.build import eval_seed, make_env
from r2ac.rl.model.distributions import action_dtype, zero_where
from r2ac.rl.run.run_dir import RunDir
from r2ac.runs.locked_dir import write_json

MAX_STREAMS = 32


@torch.no_grad()
def play_episodes(agent: Agent, env, episodes: int, greedy: bool, seed: int) -> tuple[list, int]:
    """Returns of exactly `episodes` complete episodes (stream quotas), and the steps taken."""
    n = env.num_envs
    quota = np.array([episodes // n + (b < episodes % n) for b in range(n)])
    returns: list[list[float]] = [[] for _ in range(n)]
    gen = torch.Generator().manual_seed(seed)
    obs = torch.from_numpy(env.reset(seed=seed))
    dtype = next(agent.parameters()).dtype
    last_reward, reset = torch.zeros(n, dtype=dtype), torch.ones(n, dtype=torch.bool)
    space = agent.action_space
    last_action = torch.zeros((n, *space.action_shape), dtype=action_dtype(space, dtype))
    full = agent.initial_state(n)
    state = agent.core.light_state(full)
    steps = 0
    while any(len(r) < q for r, q in zip(returns, quota)):
        logits, _, state = agent(
            obs[None], last_reward[None], reset[None], state, last_action=last_action[None]
        )
        dist = agent.distribution(logits[0])  # over (n, P)
        action = dist.mode() if greedy else dist.sample(gen)  # (n, *S); a Gaussian's mode: the mean
        res = env.step(action.numpy())
        steps += n
        done = torch.from_numpy(np.asarray(res.terminated | res.truncated, dtype=bool))
        for b in np.flatnonzero(~np.isnan(res.info["episode_return"])):
            if len(returns[b]) < quota[b]:
                returns[b].append(float(res.info["episode_return"][b]))
        obs = torch.from_numpy(np.asarray(res.obs))
        last_reward = torch.from_numpy(np.asarray(res.reward)).to(dtype).masked_fill(done, 0.0)
        last_action = zero_where(action, done)
        reset = done
    return [x for r in returns for x in r], steps


def evaluate(
    agent: Agent, cfg: TrainConfig, sets: int, episodes: int, greedy: bool, seed: int | None = None
) -> dict:
    seed = cfg.run.seed if seed is None else seed
    start, set_returns, steps = time.perf_counter(), [], 0
    was_training = agent.training
    agent.eval()
    for k in range(sets):
        s = eval_seed(seed, k)
        env = make_env(cfg, min(episodes, MAX_STREAMS), s)
        returns, n = play_episodes(agent, env, episodes, greedy, s)
        env.close()
        set_returns.append(returns)
        steps += n
    agent.train(was_training)
    means = [float(np.mean(r)) for r in set_returns]
    return {
        **protocol(cfg, sets, episodes, greedy, seed, means),
        "set_means": means,
        "returns": set_returns,
        "frames": steps,
        "seconds": time.perf_counter() - start,
    }


def protocol(cfg: TrainConfig, sets: int, episodes: int, greedy: bool, seed: int, means) -> dict:
    """eval.json's head: what was evaluated, how, and the mean and std of `means` (the set
    means; a streaming run: the agents' means)."""
    return {
        "env": cfg.env.id,
        "core": cfg.model.core,
        "sets": sets,
        "episodes_per_set": episodes,
        "actions": "greedy" if greedy else "sampled",
        "seed": seed,
        "mean": float(np.mean(means)),
        "std": float(np.std(means)),
    }


def write_eval(run: RunDir, result: dict, out: str | Path | None = None) -> Path:
    """Write the result to `out` (default RUN/eval.json, which experiment grids read)."""
    path = Path(out) if out else run.eval_path
    # atomic: the experiment runner reads "eval.json exists" as "the run is finished"
    return write_json(path, result)
