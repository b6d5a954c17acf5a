"""Build envs, agents and seeds from a TrainConfig (the only place that reads configs for them)."""

from __future__ import annotations

import random

import numpy as np
import torch

from r2ac import envs
from r2ac.envs.base import BatchedEnv
from r2ac.envs.spaces import ActionSpace
from r2ac.rl.config import TrainConfig
from r2ac.rl.model.agent import Agent, core_input_size
from r2ac.rl.model.nets import make_stem
from r2ac.rtrl.elstm.layer import chrono_forget_bias_
from r2ac.rtrl.registry import make_core

# Offsets that keep the seed streams of actors, evaluation and the agent init apart.
_EVAL_SEED_OFFSET = 1_000_003


def seed_everything(seed: int) -> None:
    """Seed torch, numpy and python random (envs and samplers have their own seeds)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - the global RNG, for third-party code
    random.seed(seed)


def actor_seed(seed: int, actor_index: int, generation: int = 0) -> int:
    """Env / sampler seed of actor `actor_index`: independent streams from one seed. A
    restarted actor process (`generation` k > 0) gets new streams, not its first ones again."""
    entropy = [seed, actor_index] + ([generation] if generation else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] % 2**31)


def eval_seed(seed: int, set_index: int) -> int:
    """Seed of evaluation set `set_index`, disjoint from every training actor's seed."""
    return int(
        np.random.SeedSequence([seed, _EVAL_SEED_OFFSET, set_index]).generate_state(1)[0] % 2**31
    )


def make_env(cfg: TrainConfig, num_envs: int, seed: int) -> BatchedEnv:
    return envs.make(cfg.env.id, num_envs, seed, **cfg.env_kwargs())


def make_actor_env(cfg: TrainConfig, num_envs: int, seed: int) -> BatchedEnv:
    """An actor's envs: `make_env`, with the first episodes cut at random under
    --decorrelate-steps (never the evaluation's)."""
    env = make_env(cfg, num_envs, seed)
    if cfg.runtime.decorrelate_steps:
        try:
            env.decorrelate(cfg.runtime.decorrelate_steps, seed)
        except BaseException:
            env.close()
            raise
    return env


def make_agent(
    cfg: TrainConfig,
    observation_shape,
    observation_dtype,
    num_actions: ActionSpace | int,
    dtype: torch.dtype = torch.float32,
    load_stem: bool = True,
) -> Agent:
    """The agent of `cfg`, initialised from torch's global RNG (seed it first);
    `num_actions` is the env's action space (an int: Discrete)."""
    stem = make_stem(
        observation_shape,
        observation_dtype,
        out_features=cfg.model.stem_features,
        channels=cfg.model.conv_channels,
        mlp_hidden=cfg.model.mlp_hidden,
        image_stem=cfg.model.image_stem,
    )
    input_size = core_input_size(
        cfg.model.stem_features, num_actions, cfg.model.prev_action, cfg.model.last_reward
    )
    core = make_core(cfg.model.core, input_size, cfg.model.hidden_size)
    if cfg.model.forget_bias is not None and hasattr(core, "b_f"):
        with torch.no_grad():
            core.b_f.fill_(cfg.model.forget_bias)
    if cfg.model.chrono_span:
        chrono_forget_bias_(core, cfg.model.chrono_span)
    agent = Agent(
        stem,
        core,
        num_actions,
        freeze_stem=cfg.model.freeze_stem,
        prev_action=cfg.model.prev_action,
        value_norm=cfg.loss.popart,
        head_hidden=cfg.model.head_hidden,
        reward_scale=cfg.loss.reward_scale,
        reward_clip=cfg.loss.reward_clip,
        feed_last_reward=cfg.model.last_reward,
        stem_norm=cfg.model.stem_norm,
        obs_norm=cfg.model.obs_norm,
    ).to(dtype)
    if load_stem and cfg.model.load_stem:
        agent.load_stem(cfg.model.load_stem)
    return agent


def agent_for_env(cfg: TrainConfig, env: BatchedEnv, dtype=torch.float32, load_stem=True) -> Agent:
    spec = env.observation_spec
    return make_agent(cfg, spec.shape, spec.dtype, env.action_space, dtype, load_stem)
