"""The streaming agents' envs: agent k's stream is the env `make_env(cfg, 1, seed + k)` would
give (the built-in envs as one batched env of K streams with each stream's seed set so; other
backends as K single-stream envs side by side), with the previous action in the observation
under --prev-action. The streaming agents take vector observations only."""

from __future__ import annotations

import math

import numpy as np
import torch

from r2ac.envs.base import ArraySpec, BatchedEnv, StepResult, stream_seeds
from r2ac.envs.builtin import _CounterRNGEnv
from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig
from r2ac.rl.model.build import make_env
from r2ac.rl.model.distributions import action_code


class ConcatEnvs(BatchedEnv):
    """K single-stream envs as one batched env of K streams (stream k: envs[k])."""

    def __init__(self, envs: list[BatchedEnv]):
        self.envs = envs
        self.num_envs = len(envs)
        self.observation_spec = envs[0].observation_spec
        self.num_actions = getattr(envs[0], "num_actions", 0)
        self._space = envs[0].action_space

    @property
    def action_space(self):
        return self._space

    def reset(self, seed: int | None = None) -> np.ndarray:
        return np.concatenate([e.reset() for e in self.envs])

    def step(self, actions: np.ndarray) -> StepResult:
        results = [e.step(actions[k : k + 1]) for k, e in enumerate(self.envs)]
        info = {
            key: np.concatenate([r.info[key] for r in results])
            for key in ("episode_return", "episode_length", "final_obs")
        }
        return StepResult(
            np.concatenate([r.obs for r in results]),
            np.concatenate([r.reward for r in results]),
            np.concatenate([r.terminated for r in results]),
            np.concatenate([r.truncated for r in results]),
            info,
        )

    def get_state(self):
        return {"envs": [e.get_state() for e in self.envs]}

    def set_state(self, state) -> None:
        for e, s in zip(self.envs, state["envs"], strict=True):
            e.set_state(s)

    def close(self) -> None:
        for e in self.envs:
            e.close()


class PreviousActionInput(BatchedEnv):
    """`env` whose (flattened) observations end with the previous action's code
    (`action_code`: one-hot per categorical, clip(a, -1, 1) for a Box), zeros at an
    episode's first step: `--prev-action` for the streaming agents, which see only the
    observation. A truncated episode's final_obs carries the action that led to it. The
    code goes through the agents' observation normalisation with the rest."""

    def __init__(self, env: BatchedEnv):
        spec = env.observation_spec
        if spec.is_image:
            raise ConfigError("--prev-action: the streaming agent takes vector observations only")
        self.env, self.num_envs = env, env.num_envs
        self.num_actions = getattr(env, "num_actions", 0)
        self._space = env.action_space
        self.obs_size = int(math.prod(spec.shape))
        self.observation_spec = ArraySpec((self.obs_size + self._space.code_size,), np.float32)

    @property
    def action_space(self):
        return self._space

    def _with(self, obs: np.ndarray, code: np.ndarray) -> np.ndarray:
        flat = np.asarray(obs, dtype=np.float32).reshape(self.num_envs, self.obs_size)
        return np.concatenate([flat, code], axis=1)  # (B, obs_size + C)

    def reset(self, seed: int | None = None) -> np.ndarray:
        zeros = np.zeros((self.num_envs, self._space.code_size), np.float32)
        return self._with(self.env.reset(seed), zeros)

    def step(self, actions: np.ndarray) -> StepResult:
        res = self.env.step(actions)
        code = action_code(self._space, torch.as_tensor(actions), torch.float32).numpy()
        done = (res.terminated | res.truncated)[:, None]
        info = {**res.info, "final_obs": self._with(res.info["final_obs"], code)}
        obs = self._with(res.obs, np.where(done, np.float32(0.0), code))
        return StepResult(obs, res.reward, res.terminated, res.truncated, info)

    def get_state(self):
        return self.env.get_state()

    def set_state(self, state) -> None:
        self.env.set_state(state)

    def close(self) -> None:
        self.env.close()


def with_inputs(cfg: TrainConfig, env: BatchedEnv) -> BatchedEnv:
    """`env` with the previous action in the observation under --prev-action."""
    return PreviousActionInput(env) if cfg.model.prev_action else env


def stream_env(cfg: TrainConfig, num_envs: int, seed: int) -> BatchedEnv:
    return with_inputs(cfg, make_env(cfg, num_envs, seed))


def agent_seeds(seed: int, k: int) -> list[int]:
    """Agent k's seed: its weights, its env stream and its sampler."""
    return [seed + i for i in range(k)]


def make_agent_envs(cfg: TrainConfig, seeds: list[int]) -> BatchedEnv:
    """Stream k is the env `make_env(cfg, 1, seeds[k])` would give: the built-in envs as one
    batched env with each stream's seed set so, other backends as K envs side by side."""
    env = make_env(cfg, len(seeds), seeds[0])
    if isinstance(env, _CounterRNGEnv):
        env.seeds[:] = [stream_seeds(s, 1)[0] for s in seeds]
        return with_inputs(cfg, env)
    env.close()
    return ConcatEnvs([stream_env(cfg, 1, s) for s in seeds])


def tensor_form(env: BatchedEnv):
    """The `TensorBuiltinEnv` equal to `env` (a built-in env, maybe behind the previous-action
    input, before its first reset), or None where there is none (other backends, tasks
    without a tensor form, a first-episode cut)."""
    from r2ac.envs.tensor_builtin import TensorBuiltinEnv

    prev = isinstance(env, PreviousActionInput)
    inner = env.env if prev else env
    if not isinstance(inner, _CounterRNGEnv) or inner.first_cut is not None:
        return None
    try:
        return TensorBuiltinEnv.like(inner, prev)
    except ConfigError:  # no tensor form of this task
        return None
