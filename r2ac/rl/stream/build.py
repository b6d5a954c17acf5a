"""The streaming agents from a config: one builder per algorithm (`BUILDERS`), each taking the
config's own options; the core is a stacked core (r2ac/rtrl/stacked) of `--core` and
`--hidden-size`, under every network."""

from __future__ import annotations

import math

import torch

from r2ac.envs.base import BatchedEnv
from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig
from r2ac.rl.stream.ac import StreamAC, StreamSettings
from r2ac.rl.stream.intentional_q import IntentionalQSettings, StreamIntentionalQ
from r2ac.rl.stream.protocol import StreamAgent
from r2ac.rl.stream.qrc import QRCSettings, StreamQRC


def ac_agent(cfg: TrainConfig, make_core, space, obs_size: int, seeds, dtype) -> StreamAC:
    s = cfg.stream
    settings = StreamSettings(
        discount=cfg.loss.discount,
        trace_lambda=s.trace_lambda,
        lr=cfg.optim.learning_rate,
        kappa_actor=s.kappa_actor,
        kappa_critic=s.kappa_critic,
        entropy_cost=cfg.loss.entropy_cost,
        optimizer=s.stream_optimizer,
        eta_actor=s.eta_actor,
        eta_critic=s.eta_critic,
    )
    return StreamAC(
        make_core, space, obs_size, seeds, settings, s.stream_mlp, dtype, s.stream_top_mlp
    )


def qrc_settings(cfg: TrainConfig) -> QRCSettings:
    """--learning-rate is Q's SGD step; epsilon decays over epsilon_fraction x --total-frames
    (each agent's steps), as the anchor's schedule over its total_timesteps."""
    s = cfg.stream
    return QRCSettings(
        discount=cfg.loss.discount,
        trace_lambda=s.trace_lambda,
        lr=cfg.optim.learning_rate,
        h_lr=s.h_learning_rate,
        beta=s.qrc_beta,
        epsilon_start=s.epsilon_start,
        epsilon_end=s.epsilon_end,
        epsilon_steps=int(cfg.run.total_frames * s.epsilon_fraction),
    )


def intentional_q_settings(cfg: TrainConfig) -> IntentionalQSettings:
    """--learning-rate multiplies --eta-q (as stream AC's intentional etas); epsilon as QRC's."""
    s = cfg.stream
    return IntentionalQSettings(
        discount=cfg.loss.discount,
        trace_lambda=s.trace_lambda,
        lr=cfg.optim.learning_rate,
        eta=s.eta_q,
        epsilon_start=s.epsilon_start,
        epsilon_end=s.epsilon_end,
        epsilon_steps=int(cfg.run.total_frames * s.epsilon_fraction),
    )


def q_agent(cfg: TrainConfig, make_core, space, obs_size: int, seeds, dtype) -> StreamQRC:
    """QRC(lambda); with --stream-optimizer intentional, Q(lambda) with intentional updates."""
    s = cfg.stream
    if s.stream_optimizer == "intentional":
        cls, settings = StreamIntentionalQ, intentional_q_settings(cfg)
    else:
        cls, settings = StreamQRC, qrc_settings(cfg)
    return cls(make_core, space, obs_size, seeds, settings, s.stream_mlp, dtype, s.stream_top_mlp)


BUILDERS = {"stream-ac": ac_agent, "stream-q": q_agent}


def make_stream_agent(cfg: TrainConfig, env: BatchedEnv, seeds, dtype=torch.float32) -> StreamAgent:
    """The K agents of `cfg.loss.algorithm` for `env`'s observations and actions, agent k's
    weights drawn from seeds[k]."""
    from r2ac.rtrl.stacked import make_stacked_core

    spec = env.observation_spec
    if spec.is_image:
        raise ConfigError(f"{cfg.env.id}: the streaming agent takes vector observations only")
    obs_size = int(math.prod(spec.shape))

    def core(k: int, d: int):
        return make_stacked_core(cfg.model.core, k, d, cfg.model.hidden_size, dtype)

    build = BUILDERS[cfg.loss.algorithm]
    agent = build(cfg, core, env.action_space, obs_size, seeds, dtype)
    return with_forget_bias(agent, cfg.model.forget_bias)


@torch.no_grad()
def with_forget_bias(agent: StreamAgent, forget_bias: float | None) -> StreamAgent:
    """`agent` with every eLSTM core's forget-gate bias b_f set to `forget_bias` (None: the
    core's own init), in every network, as `--forget-bias` sets the batched agent's."""
    if forget_bias is None:
        return agent
    for net, theta in agent.nets().values():
        views = net.layout.views(theta)
        if "core.b_f" not in views:
            raise ConfigError(f"--forget-bias: core {net.core.name} has no forget gate")
        views["core.b_f"].fill_(forget_bias)
    return agent


def memory_estimate(
    cfg: TrainConfig, obs_size: int, action_size: int
) -> dict[str, tuple[int, str]]:
    """Bytes the K agents hold, by part, each with the options that size it (what the check
    before a run compares with the memory available): weights, gradients, traces and ObGD's
    scratch (4 x (2, K, P) floats; 6 with intentional updates), the carried core states with their sensitivities (2K rows,
    and as many again for a step's next state), the normalisers. From K, the hidden size and
    the widths, the core on the meta device (nothing is allocated)."""
    from r2ac.rtrl.stacked import make_stacked_core

    k, s = cfg.stream.num_agents, cfg.stream
    feat = s.stream_mlp[-1] if s.stream_mlp else obs_size
    core = make_stacked_core(
        cfg.model.core, 1, feat, cfg.model.hidden_size, torch.float32, device="meta"
    )

    def layers(widths) -> int:
        return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))

    def params(out: int) -> int:
        top = [core.output_size, *s.stream_top_mlp]
        return (
            layers([obs_size, *s.stream_mlp])
            + core.param_numbers()
            + layers(top)
            + (top[-1] + 2) * out
        )

    per_agent = max(params(action_size), params(1))
    intentional = s.stream_optimizer == "intentional"
    buffers = 6 if intentional else 4  # intentional: its RMSProp scale and D too
    state = core.state_numbers()
    sizes = "--num-agents, --hidden-size, --stream-mlp or --stream-top-mlp"
    return {
        "weights, gradients, traces": (buffers * 2 * k * per_agent * 4, sizes),
        "core states": (2 * 2 * k * state * 4, "--num-agents or --hidden-size"),
        "normalisers": (3 * k * obs_size * 8, "--num-agents"),
    }
