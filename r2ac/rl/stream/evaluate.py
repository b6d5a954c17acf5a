"""The evaluation of K streaming agents: each agent's frozen policy (its normaliser frozen too)
on `sets` seeded sets of `episodes` complete episodes (set s of agent k: env seed
eval_seed(seed + k, s)), the same protocol as the batched trainer's (r2ac/rl/run/evaluation.py);
eval.json holds each agent's result and their mean."""

from __future__ import annotations

import time

import numpy as np
import torch

from r2ac.counter_hash import uniforms
from r2ac.rl.config import TrainConfig
from r2ac.rl.model.build import eval_seed
from r2ac.rl.run.evaluation import protocol
from r2ac.rl.stream.envs import stream_env
from r2ac.rl.stream.nets import detach_state
from r2ac.rl.stream.protocol import StreamAgent

MAX_EVAL_STREAMS = 32


def evaluate_agents(
    agent: StreamAgent, cfg: TrainConfig, seeds: list[int], sets: int, episodes: int, greedy: bool
) -> dict:
    """eval.json's dict: every agent's mean over its sets, their mean and std."""
    start, steps, per_agent = time.perf_counter(), 0, []
    for k, agent_seed in enumerate(seeds):
        means = []
        for s in range(sets):
            seed = eval_seed(agent_seed, s)
            env = stream_env(cfg, min(episodes, MAX_EVAL_STREAMS), seed)
            try:
                returns, n = play_agent(agent, k, env, episodes, greedy, seed)
            finally:
                env.close()
            means.append(float(np.mean(returns)))
            steps += n
        per_agent.append({"seed": agent_seed, "mean": float(np.mean(means)), "set_means": means})
    agent_means = [a["mean"] for a in per_agent]
    return {
        **protocol(cfg, sets, episodes, greedy, cfg.run.seed, agent_means),
        "num_agents": len(seeds),
        "agents": per_agent,
        "frames": steps,
        "seconds": time.perf_counter() - start,
    }


@torch.no_grad()
def play_agent(agent: StreamAgent, k: int, env, episodes: int, greedy: bool, seed: int):
    """Agent k's policy (no learning) on env's B streams: the returns of exactly `episodes`
    complete episodes (stream quotas, as r2ac eval), and the steps taken."""
    b = env.num_envs
    net, theta = agent.acting_net()
    net = net.resized(b)
    theta = theta.detach()[k : k + 1].expand(b, -1).contiguous()
    mean, var = agent.obs_stats.mean[k : k + 1], agent.obs_stats.var()[k : k + 1]
    quota = np.array([episodes // b + (i < episodes % b) for i in range(b)])
    returns: list[list[float]] = [[] for _ in range(b)]
    sampler = np.array([seed * 1000 + i for i in range(b)], dtype=np.uint64)
    state, reset = net.core.initial_state(), torch.ones(b, dtype=torch.bool)
    obs, steps = env.reset(seed=seed), 0
    while any(len(r) < q for r, q in zip(returns, quota)):
        x = (np.asarray(obs, dtype=np.float64).reshape(b, -1) - mean) / np.sqrt(var + 1e-8)
        out, state = net.step(theta, torch.from_numpy(x).to(agent.dtype), state, reset)
        u = None if greedy else torch.from_numpy(uniforms(sampler, steps, agent.draws()))
        action = agent.choose(out, u, greedy)
        state = detach_state(state)
        res = env.step(action.numpy())
        steps += 1
        for i in np.flatnonzero(~np.isnan(res.info["episode_return"])):
            if len(returns[i]) < quota[i]:
                returns[i].append(float(res.info["episode_return"][i]))
        obs = res.obs
        reset = torch.from_numpy(np.asarray(res.terminated | res.truncated, dtype=bool))
    return [x for r in returns for x in r], steps * b
