"""Tiny configs shared by the trainer tests."""

from __future__ import annotations

import dataclasses

from r2ac.rl.config import TrainConfig

TINY = TrainConfig(
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
    return dataclasses.replace(TINY, **kw)
