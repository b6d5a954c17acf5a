"""DeepMind Lab: `dmlab/<level>`, used when `deepmind_lab` is importable.

Observations (3, 72, 96) uint8 from RGB_INTERLEAVED (96 wide, 72 high); IMPALA's 9 actions;
each action is repeated 4 times (rewards summed by DMLab). Every episode of stream b starts
with a level seed drawn from stream b's own generator (seeded from its SeedSequence child),
so streams play different, reproducible levels. DMLab only says "episode over" (mostly a
time limit it does not distinguish), reported as `terminated`; it cannot render after the
end, so `info["final_obs"]` holds the last observation before the final step.
`get_state`/`set_state` are not supported.

Short level names map to the DMLab-30 suite: `dmlab/rooms_watermaze` ->
`contributed/dmlab30/rooms_watermaze`; names containing "/" are used as given, within
DMLab's level folder (an absolute path, "..", or a `.lua` file is refused: a level is a Lua
script, and a run directory's config.json names no code to run).
"""

from __future__ import annotations

import re

import numpy as np

from r2ac.envs.base import ArraySpec, BatchedEnv, EpisodeStats, StepResult, stream_seeds
from r2ac.errors import ConfigError, MissingDependencyError

MEMORY_LEVELS = ("rooms_select_nonmatching_object", "rooms_watermaze")
REACTIVE_LEVELS = ("rooms_keys_doors_puzzle",)

# IMPALA's action set: (look left/right, look down/up, strafe left/right, forward/back,
# fire, jump, crouch).
ACTION_SET = np.array(
    [
        (0, 0, 0, 1, 0, 0, 0),  # forward
        (0, 0, 0, -1, 0, 0, 0),  # backward
        (0, 0, -1, 0, 0, 0, 0),  # strafe left
        (0, 0, 1, 0, 0, 0, 0),  # strafe right
        (-20, 0, 0, 0, 0, 0, 0),  # look left
        (20, 0, 0, 0, 0, 0, 0),  # look right
        (-20, 0, 0, 1, 0, 0, 0),  # look left + forward
        (20, 0, 0, 1, 0, 0, 0),  # look right + forward
        (0, 0, 0, 0, 1, 0, 0),  # fire
    ],
    dtype=np.intc,
)

INSTALL_HINT = (
    "deepmind_lab is not installed and is not on PyPI. Build it from source: "
    "git clone https://github.com/google-deepmind/lab && cd lab && "
    "bazel build -c opt //python/pip_package:build_pip_package && "
    "./bazel-bin/python/pip_package/build_pip_package /tmp/dmlab_pkg && "
    "pip install /tmp/dmlab_pkg/deepmind_lab-*.whl (needs bazel, a C++ toolchain, "
    "libosmesa6-dev and python3-dev)"
)


def _deepmind_lab():
    try:
        import deepmind_lab
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    return deepmind_lab


# A level inside DMLab's own level folder: names, not a path of one's own (a level is a Lua
# script, so a run directory's config.json must not point DMLab at a script beside it)
_LEVEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")


def level_path(level: str) -> str:
    """DMLab's name of a level (ConfigError for an absolute path, "..", or a file name)."""
    if not _LEVEL.fullmatch(level) or ".." in level or level.endswith(".lua"):
        raise ConfigError(
            f"dmlab level {level!r}: expected a level name of DMLab's (e.g. rooms_watermaze, "
            "contributed/dmlab30/rooms_watermaze), not a path or a script file"
        )
    return level if "/" in level else f"contributed/dmlab30/{level}"


class DMLabEnv(BatchedEnv):
    """num_envs DMLab instances stepped in a Python loop with same-step auto-reset."""

    num_actions = len(ACTION_SET)

    def __init__(
        self,
        level: str,
        num_envs: int,
        seed: int = 0,
        action_repeat: int = 4,
        width: int = 96,
        height: int = 72,
        renderer: str = "software",
    ):
        path = level_path(level)  # checked before DMLab is imported
        lab = _deepmind_lab()
        config = {"width": str(width), "height": str(height)}
        self.level, self.num_envs, self.action_repeat = level, num_envs, action_repeat
        self.envs = [
            lab.Lab(path, ["RGB_INTERLEAVED"], config=config, renderer=renderer)
            for _ in range(num_envs)
        ]
        self.observation_spec = ArraySpec((3, height, width), np.dtype(np.uint8))
        self.stats = EpisodeStats(num_envs)
        self._seed_streams(seed)

    def _seed_streams(self, seed: int) -> None:
        self._rngs = [np.random.default_rng(int(s)) for s in stream_seeds(seed, self.num_envs)]

    def _start_episode(self, b: int) -> np.ndarray:
        self.envs[b].reset(seed=int(self._rngs[b].integers(2**31 - 1)))
        return self._observe(b)

    def _observe(self, b: int) -> np.ndarray:
        return self.envs[b].observations()["RGB_INTERLEAVED"].transpose(2, 0, 1)  # (3, H, W)

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self._seed_streams(seed)
        self.stats.reset()
        self._last_obs = np.stack([self._start_episode(b) for b in range(self.num_envs)])
        return self._last_obs

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._check_actions(actions)
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        final_obs = self._last_obs.copy()
        obs = np.empty_like(final_obs)
        for b, env in enumerate(self.envs):
            reward[b] = env.step(ACTION_SET[actions[b]], num_steps=self.action_repeat)
            terminated[b] = not env.is_running()
            if terminated[b]:
                obs[b] = self._start_episode(b)
            else:
                obs[b] = final_obs[b] = self._observe(b)
        self._last_obs = obs
        info = self.stats.update(reward, terminated)
        info["final_obs"] = final_obs
        truncated = np.zeros(self.num_envs, dtype=bool)
        return StepResult(obs, reward, terminated, truncated, info)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_dmlab(
    level: str,
    num_envs: int,
    seed: int = 0,
    action_repeat: int = 4,
    width: int = 96,
    height: int = 72,
    renderer: str = "software",
) -> DMLabEnv:
    # Explicit keywords (not **options) so that check_options rejects unknown ones.
    return DMLabEnv(
        level,
        num_envs,
        seed,
        action_repeat=action_repeat,
        width=width,
        height=height,
        renderer=renderer,
    )
