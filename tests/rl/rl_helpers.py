"""Tiny configs shared by the trainer tests."""

from __future__ import annotations

import torch

from r2ac.rl.config import TrainConfig
from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import agent_for_env, make_env

TINY = TrainConfig.make(
    env="builtin/delayed-cue",
    env_options=("delay=3",),
    core="elstm-rtrl",
    hidden_size=8,
    forget_bias=None,
    freeze_stem=False,
    entropy_cost=0.01,
    stem_features=6,
    mlp_hidden=(8,),
    unroll_length=4,
    num_envs=3,
    batch_size=3,
    total_frames=3 * 4 * 6,
    learning_rate=1e-3,
    checkpoint_every=2,
    log_every=1,
    eval_sets=2,
    eval_episodes=4,
    progress=False,
)


def tiny(**kw) -> TrainConfig:
    return TINY.updated(**kw)


def serial_grads(cfg: TrainConfig, weights: dict, wanted: dict[int, int], dtype) -> dict:
    """Gradient of segment `seq` of actor k, collected in this process as the serial runtime
    does (same seeds, same weights), for seq = 1 .. wanted[k]: {(k, seq): {name: grad}}."""

    from r2ac.rl.learning.actor import Actor
    from r2ac.rl.learning.learner import Learner
    from r2ac.rl.model.build import actor_seed, agent_for_env, make_env

    out = {}
    for k, n in wanted.items():
        seed = actor_seed(cfg.run.seed, k)
        env = make_env(cfg, cfg.runtime.num_envs, seed)
        agent = agent_for_env(cfg, env, dtype)
        agent.load_state_dict(weights)
        actor, learner = Actor(agent, env, seed, cfg.runtime.unroll_length), Learner(agent, cfg)
        for seq in range(1, n + 1):
            seg, _ = actor.collect()
            agent.zero_grad()
            learner.backward(seg)
            out[k, seq] = {name: p.grad.clone() for name, p in agent.named_parameters()}
        env.close()
    return out


def record_gradients(runtime) -> list[dict]:
    """Wrap `runtime.learner.backward`: the list it returns gets each update's gradient
    (before clipping), by parameter name."""
    grads, real_backward = [], runtime.learner.backward

    def backward(seg):
        out = real_backward(seg)
        grads.append({n: p.grad.clone() for n, p in runtime.agent.named_parameters()})
        return out

    runtime.learner.backward = backward
    return grads


def segments_wanted(taken: list[list[tuple]]) -> dict[int, int]:
    """From each update's (actor, epoch or generation, seq, ...) tuples: the highest seq
    taken from each actor (all must be of its first epoch)."""
    wanted: dict[int, int] = {}
    for actor, epoch, seq, *_ in (s for group in taken for s in group):
        assert epoch == 0
        wanted[actor] = max(wanted.get(actor, 0), seq)
    return wanted


def run_learner_lr0(cfg, M: int, B: int, K: int):
    """K learner updates with lr 0 on B streams of M-step segments (float64); returns the
    agent, the segments and the gradient summed over the updates. Checks the weights stayed
    fixed (lr 0), so every segment was collected by one policy."""
    torch.manual_seed(0)
    env = make_env(cfg, B, seed=7)
    agent = agent_for_env(cfg, env, dtype=torch.float64)
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    actor, learner = Actor(agent, env, seed=7, unroll_length=M), Learner(agent, cfg)
    segments, grads = [], {}
    for _ in range(K):
        seg, _ = actor.collect()
        segments.append(seg)
        learner.update(seg)
        for name, p in agent.named_parameters():
            grads[name] = grads.get(name, 0) + p.grad.clone()
    for k, v in agent.state_dict().items():  # lr = 0: the policy stayed fixed
        assert torch.equal(v, before[k]), k
    return agent, segments, grads


def agents_with(cfg: TrainConfig, field: str, values) -> list:
    """One agent per value of config `field` (the same seed, env and dtype), to compare inits."""
    env = make_env(cfg, cfg.runtime.num_envs, 0)
    agents = []
    for value in values:
        torch.manual_seed(0)
        agents.append(agent_for_env(cfg.updated(**{field: value}), env, torch.float32))
    env.close()
    return agents
