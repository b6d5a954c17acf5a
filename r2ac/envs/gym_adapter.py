"""Gymnasium: any registered env, one instance per stream.

`gym/<id>`, e.g. `gym/popgym-RepeatPreviousEasy-v0` (POPGym's memory tasks; `import popgym`
is done for ids starting with "popgym-", `import minigrid` for "MiniGrid-") or
`gym/MinAtar/Breakout-v1` (MinAtar's 10x10 versions of five Atari games, which register
their ids when asked: `minatar.gym.register_envs()` is called for ids starting with
"MinAtar/"). A user's own env, in gymnasium's `module:EnvId` form (`gym/myenvs:MyCue-v0`):
the module (on PYTHONPATH) is imported first and registers EnvId when imported, as
`gymnasium.make("myenvs:MyCue-v0")` does, if this process was allowed to import it
(r2ac/envs/trust.py: named on the command line, or trusted explicitly).

Observations: a uint8 Box of rank 3 is an image and becomes (C, H, W) (Gymnasium images are
(H, W, C)); any other space is flattened to a float32 vector (Discrete and MultiDiscrete
become one-hot codes). `obs_key` picks one entry of a Dict space (MiniGrid: "image").
Dict and Tuple spaces are flattened the same way (a space `gymnasium.spaces.flatten`
cannot flatten is refused at build time).
Actions (r2ac/envs/spaces.py `from_gym`): Discrete (with its `start` added back),
MultiDiscrete, MultiBinary and float Box spaces; a Box action arrives in normalised units and
is clipped and scaled to the bounds here. Any other action space is refused at build time.
Streams are stepped in a Python loop and reset in the same step they finish (the protocol
of `r2ac.envs.base`); stream b is seeded once with the b-th SeedSequence-derived seed and
then continues its own random sequence. `get_state`/`set_state` are not supported.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import warnings
from typing import Any

import numpy as np

from r2ac.envs import trust
from r2ac.envs.base import (
    ArraySpec,
    BatchedEnv,
    EpisodeStats,
    StepResult,
    merge_final_obs,
    stream_seeds,
)
from r2ac.envs.spaces import ActionSpace, box_to_env, check_actions, from_gym
from r2ac.errors import ConfigError, require

# Env id prefix -> (module to import so that it registers its envs, pip package, extra)
_REGISTERING_PACKAGES = {
    "popgym-": ("popgym", "popgym", "popgym"),
    "MiniGrid-": ("minigrid", "minigrid", "minigrid"),
    "MinAtar/": ("minatar.gym", "minatar", "minatar"),
}


def _gymnasium():
    return require("gymnasium", "gymnasium", "gym")


def _register(env_id: str):
    """Import the package that registers `env_id` (POPGym, MiniGrid, MinAtar) if needed."""
    gym = _gymnasium()
    for prefix, (module, package, extra) in _REGISTERING_PACKAGES.items():
        if env_id.startswith(prefix):
            registering = require(module, package, extra)
            if env_id not in gym.registry and hasattr(registering, "register_envs"):
                registering.register_envs()  # MinAtar registers only on request
    return gym


def registered_ids(prefix: str) -> list[str]:
    """Every registered Gymnasium id starting with `prefix` (registering its package first);
    [] when gymnasium or the package is missing."""
    try:
        gym = _register(prefix)
    except (ImportError, ConfigError):
        return []
    return sorted(i for i in gym.registry if i.startswith(prefix))


def _accepted_options(gym, env_id: str) -> list[str]:
    """Keyword arguments the env's constructor takes (for the error message)."""
    entry = gym.registry[env_id].entry_point
    try:
        target = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        params = inspect.signature(target).parameters.values()
    except (AttributeError, ImportError, TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _import_user_module(env_id: str) -> str:
    """For gymnasium's "module:EnvId" form: import the module (which registers EnvId, as
    `gymnasium.make` would import it) and return EnvId; other ids come back unchanged."""
    module, sep, bare_id = env_id.partition(":")
    if not sep:
        return env_id
    if not module or not bare_id or ":" in bare_id:
        raise ConfigError(f"gym env {env_id!r}: expected '<module>:<EnvId>'")
    trust.check_may_import(f"gym/{env_id}")  # a run directory's config names no code to run
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or module
        where = (
            "is it on PYTHONPATH? (e.g. PYTHONPATH=. r2ac train ...)"
            if module == missing or module.startswith(f"{missing}.")
            else f"importing it needs {missing!r}, which is missing"
        )
        raise ConfigError(f"gym/{env_id}: cannot import module {module!r}: {where}") from exc
    return bare_id


def _make_one(env_id: str, **kwargs: Any):
    module = env_id.partition(":")[0] if ":" in env_id else ""
    env_id = _import_user_module(env_id)
    gym = _register(env_id)
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        source = f" (importing {module!r} did not register it)" if module else ""
        raise ConfigError(
            f"gymnasium has no env {env_id!r}{source}{hint} (`r2ac envs --ids` lists them)"
        )
    _quiet_checker_warnings()
    try:
        return gym.make(env_id, **kwargs)
    except TypeError as exc:  # an option the env's constructor does not take
        accepted = _accepted_options(gym, env_id)
        raise ConfigError(
            f"{env_id} does not take env options {sorted(kwargs)}; it accepts "
            f"{accepted or 'none'} (pass a bare --env-options for none)"
        ) from exc
    except gym.error.Error as exc:
        raise ConfigError(f"gymnasium cannot make {env_id!r}: {exc}") from exc


def _quiet_checker_warnings() -> None:
    """Show each of gymnasium's env-checker warnings once per process, not once per step
    (CountRecall's observations trip the PassiveEnvChecker on every step)."""
    warnings.filterwarnings("once", module=r"gymnasium\.utils\.passive_env_checker")
    warnings.filterwarnings("once", category=UserWarning, module=r"gymnasium\..*")


class _ObsConverter:
    """Turns one raw observation of a Gymnasium space into the protocol's array."""

    def __init__(self, space, obs_key: str | None):
        gym = _gymnasium()
        self.obs_key = obs_key
        self.space = space[obs_key] if obs_key else space
        box = isinstance(self.space, gym.spaces.Box)
        self.is_image = box and self.space.dtype == np.uint8 and len(self.space.shape) == 3
        if self.is_image:
            h, w, c = self.space.shape
            self.spec = ArraySpec((c, h, w), np.dtype(np.uint8))
        else:
            try:
                size = gym.spaces.flatdim(self.space)
            except (NotImplementedError, ValueError, TypeError) as exc:
                raise ConfigError(f"observation space {self.space} cannot be flattened") from exc
            self.spec = ArraySpec((size,), np.dtype(np.float32))

    def __call__(self, obs) -> np.ndarray:
        if self.obs_key:
            obs = obs[self.obs_key]
        if self.is_image:
            return np.asarray(obs).transpose(2, 0, 1)
        return _gymnasium().spaces.flatten(self.space, obs).astype(np.float32)


class GymEnv(BatchedEnv):
    """num_envs Gymnasium envs stepped in lock-step with same-step auto-reset."""

    can_cut_episodes = True

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        obs_key: str | None = None,
        **make_kwargs: Any,
    ):
        self.env_id, self.num_envs = env_id, num_envs
        self.envs = [_make_one(env_id, **make_kwargs) for _ in range(num_envs)]
        space = self.envs[0].action_space
        self._action_space, self._action_shape, self._start = from_gym(space, env_id)
        self.num_actions = self._action_space.head_size
        if self._action_space.is_float:
            self._low, self._high = (np.asarray(b) for b in (space.low, space.high))
            self._low, self._high = self._low.ravel(), self._high.ravel()
            self._action_dtype = space.dtype
        self._convert = _ObsConverter(self.envs[0].observation_space, obs_key)
        self.observation_spec = self._convert.spec
        self.stats = EpisodeStats(num_envs)
        self._unused_seed: int | None = seed  # applied by the first reset

    @property
    def action_space(self) -> ActionSpace:
        return self._action_space

    def _env_actions(self, actions: np.ndarray) -> list:
        """(B, *action_shape) protocol actions -> one Gymnasium action per stream."""
        actions = check_actions(self._action_space, actions, self.num_envs)
        if self._action_space.kind == "discrete":
            return [int(a) + self._start for a in actions]
        if self._action_space.is_float:
            actions = box_to_env(actions, self._low, self._high).astype(self._action_dtype)
        return [a.reshape(self._action_shape) for a in actions]

    def _stack(self, observations: list) -> np.ndarray:
        return np.stack([self._convert(o) for o in observations])

    def reset(self, seed: int | None = None) -> np.ndarray:
        seed = self._unused_seed if seed is None else seed
        self._unused_seed = None
        seeds = None if seed is None else stream_seeds(seed, self.num_envs)
        observations = [
            env.reset(seed=None if seeds is None else int(seeds[b]))[0]
            for b, env in enumerate(self.envs)
        ]
        self.stats.reset()
        self._start_cuts()
        return self._stack(observations)

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._env_actions(actions)
        results = [env.step(a) for env, a in zip(self.envs, actions, strict=True)]
        obs = self._stack([r[0] for r in results])
        reward = np.array([r[1] for r in results], dtype=np.float32)
        terminated = np.array([r[2] for r in results], dtype=bool)
        truncated = np.array([r[3] for r in results], dtype=bool) & ~terminated
        truncated = self._with_cuts(terminated, truncated)
        done = terminated | truncated
        stats = self.stats.update(reward, done)
        reset_obs = [self.envs[b].reset()[0] for b in np.flatnonzero(done)]
        obs, final_obs = merge_final_obs(obs, self._stack(reset_obs) if reset_obs else None, done)
        return StepResult(obs, reward, terminated, truncated, {**stats, "final_obs": final_obs})

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_gym(env_id: str, num_envs: int, seed: int = 0, **options: Any) -> GymEnv:
    """`gym/<id>`; options go to `gymnasium.make` except `obs_key`."""
    return GymEnv(env_id, num_envs, seed, **options)
