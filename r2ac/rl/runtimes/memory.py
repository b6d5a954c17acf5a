"""Memory a batched training run will need, estimated before anything large is allocated
(`estimate(cfg)`, what `Runtime.memory_estimate` answers): one env stream (to read its
observation size and action count) and the agent on torch's "meta" device (shapes only, no
memory) give parameter and per-stream core-state bytes; added up is what the runtime holds:
segment buffers, the carried core states (RTRL sensitivities: 2*N*D floats per eLSTM stream),
the learner's batch, activations and optimiser state. Rough (within ~2x)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from r2ac.rl.config import TrainConfig

FLOAT = 4  # bytes of the float32 buffers, activations and states


@dataclass(frozen=True)
class Sizes:
    """What the estimate depends on, per stream (bytes unless said otherwise)."""

    obs_values: int  # values in one observation
    obs_bytes: int  # bytes of one observation
    image_pixels: int  # pixels of an image observation (a conv stem), 0 for vectors
    num_actions: int  # the policy's parameters per step (logits; a Gaussian's 2D)
    param_bytes: int  # the agent's parameters
    state_bytes: int  # one stream's full core state (with sensitivities)


def segment_bytes(cfg: TrainConfig, s: Sizes) -> int:
    """One stream's segment (actor.py's layout) and its start state."""
    M = cfg.runtime.unroll_length
    per_input = s.obs_bytes + FLOAT + 1  # obs, last_reward, reset: M+1 of them
    per_step = 8 + FLOAT + 1 + 1 + FLOAT * s.num_actions + FLOAT  # actions .. final_values
    return (M + 1) * per_input + M * per_step + s.state_bytes


def activation_bytes(cfg: TrainConfig, s: Sizes) -> int:
    """The learner's forward/backward memory for one stream-step (rough)."""
    if s.image_pixels:  # conv stages at full, 1/2, 1/4 resolution, a few tensors each
        stem = s.obs_values + 3 * sum(cfg.model.conv_channels) * s.image_pixels
    else:
        stem = s.obs_values + 2 * sum(cfg.model.mlp_hidden)
    values = (
        stem + 4 * cfg.model.stem_features + 24 * cfg.model.hidden_size + 2 * cfg.model.head_hidden
    )
    values += 6 * s.num_actions + 20
    return FLOAT * values


def estimate(cfg: TrainConfig, s: Sizes | None = None) -> dict[str, tuple[int, str]]:
    """Bytes by part, each with the options that size it (s: measured when not given)."""
    s = measure(cfg) if s is None else s
    B, Be, M = cfg.runtime.batch_size, cfg.runtime.num_envs, cfg.runtime.unroll_length
    seg = segment_bytes(cfg, s)
    inputs = M * (cfg.model.stem_features + 1) * FLOAT  # the actor's recorded core inputs
    if cfg.runtime.name == "parallel":
        slots = max(2 * cfg.actors, 2 * cfg.segments_per_batch)
        actor_total = slots * Be * seg + cfg.actors * (Be * (seg + inputs) + s.param_bytes)
    else:
        actor_total = B * (seg + s.state_bytes + inputs)
    obs_option = (
        f"--env-options (observations of {s.obs_values} values)" if s.obs_values > 4096 else None
    )
    segment_option = obs_option or "--unroll-length or --batch-size"
    return {
        "segment buffers": (actor_total + B * seg, segment_option),
        "activations": (
            B * (M + 1) * activation_bytes(cfg, s),
            obs_option or "--unroll-length or --batch-size",
        ),
        "core states": (3 * B * s.state_bytes, "--hidden-size or --batch-size"),
        "parameters": (4 * s.param_bytes, "--hidden-size, --stem-features or the env's size"),
    }


def measure(cfg: TrainConfig) -> Sizes:
    """Sizes of `cfg`'s env and agent: one env stream, the agent on the meta device."""
    from r2ac.rl.model.build import make_agent, make_env

    env = make_env(cfg, 1, 0)
    spec, actions = env.observation_spec, env.action_space
    env.close()
    with torch.device("meta"):
        agent = make_agent(cfg, spec.shape, spec.dtype, actions, load_stem=False)
        state = agent.initial_state(1)
    leaves = [t for t in pytree.tree_leaves(state) if isinstance(t, torch.Tensor)]
    values = math.prod(spec.shape)
    return Sizes(
        values,
        values * spec.dtype.itemsize,
        len(spec.shape) == 3,
        actions.param_size,
        sum(p.numel() * p.element_size() for p in agent.parameters()),
        sum(t.numel() * t.element_size() for t in leaves),
    )
