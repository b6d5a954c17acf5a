"""envpool (C++ batched simulators): Atari, ProcGen, MiniGrid, or any envpool task id.

envpool resets a finished env one step late: the step after `done` ignores the action and
returns the reset observation with reward 0. This adapter hides that: whenever streams
finish, it resets exactly those at once (`pool.reset(env_ids)`), so the protocol of
`r2ac.envs.base` (same-step auto-reset, no dropped action) holds. envpool then steps them
normally on the next call (checked by tests/envs/test_envpool.py).

Observations: Atari (4, 84, 84) uint8 (4 stacked grey frames), ProcGen (3, 64, 64) uint8,
MiniGrid the agent's 7x7 view (direction and mission are dropped) as a one-hot float32 vector
of 20 * 7 * 7 = 980 (object, colour and state codes of every cell; `obs_encoding="image"`
gives the raw (3, 7, 7) uint8 codes instead).
Rewards are raw. `get_state`/`set_state` are not supported (envpool cannot snapshot).

Atari `episodic_life=True` is the DeepMind/torchbeast wrapper's meaning, implemented here:
losing a life is `terminated` for the learner (value 0 after it, core state reset), but the
game goes on, and `episode_return`/`episode_length` count whole games. envpool's own flag
cannot be passed through: under the explicit resets above it restarts the whole game at
every lost life, which would turn Breakout into a one-life game.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from r2ac.envs.base import (
    ArraySpec,
    BatchedEnv,
    EpisodeStats,
    StepResult,
    merge_final_obs,
    stream_seeds,
)
from r2ac.errors import ConfigError, require

ATARI_GAMES = ("Breakout", "Gravitar", "MsPacman", "Qbert", "Seaquest", "Solaris", "Skiing")

# The paper's Atari preprocessing; reward clipping is left to the learner. envpool's own
# episodic_life stays off (see the module doc; make_atari's `episodic_life` replaces it).
ATARI_DEFAULTS = dict(
    img_height=84,
    img_width=84,
    gray_scale=True,
    stack_num=4,
    frame_skip=4,
    noop_max=30,
    reward_clip=False,
    episodic_life=False,
    repeat_action_probability=0.0,
)

PROCGEN_MODES = {
    "easy": "Easy",
    "hard": "Hard",
    "extreme": "Extreme",
    "memory": "Memory",
    "exploration": "Exploration",
}
QT_HINT = "ProcGen needs the Qt5 GUI runtime: apt-get install -y libqt5gui5"


def _envpool():
    return require("envpool", "envpool", "envpool")


def _check_task(task_id: str) -> None:
    known = _envpool().list_all_envs()
    if task_id not in known:
        close = [k for k in known if task_id.split("-")[0].lower() in k.lower()][:8]
        raise ConfigError(f"unknown envpool task {task_id!r}; similar: {close}")


def _channel_first(obs: np.ndarray) -> np.ndarray:
    """(B, H, W, C) images (MiniGrid) -> (B, C, H, W); channel-first batches pass through."""
    if obs.ndim == 4 and obs.shape[-1] in (1, 3) and obs.shape[1] not in (1, 3, 4):
        return np.ascontiguousarray(obs.transpose(0, 3, 1, 2))
    return obs


class EnvpoolEnv(BatchedEnv):
    """A synchronous envpool pool (batch_size == num_envs) behind the batched protocol."""

    def __init__(
        self,
        task_id: str,
        num_envs: int,
        seed: int = 0,
        life_loss_terminal: bool = False,
        **config: Any,
    ):
        envpool = _envpool()
        _check_task(task_id)
        fields = envpool.make_spec(task_id).config._fields
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise ConfigError(f"unknown options {unknown} for {task_id}; known: {sorted(fields)}")
        self.task_id, self.num_envs, self._config = task_id, num_envs, config
        self._per_stream_seeds = "env_seed" in fields
        self._all_ids = np.arange(num_envs, dtype=np.int32)
        self.stats = EpisodeStats(num_envs)
        self._pool = self._make_pool(seed)
        self.life_loss_terminal = life_loss_terminal
        self._lives = np.zeros(num_envs, dtype=np.int64)  # (B,) lives left, per stream
        space = self._pool.observation_space
        self._obs_key = "image" if hasattr(space, "spaces") else None
        image_space = space[self._obs_key] if self._obs_key else space
        probe = _channel_first(np.zeros((1, *image_space.shape), image_space.dtype))
        self.observation_spec = ArraySpec(probe.shape[1:], np.dtype(image_space.dtype))
        self.num_actions = int(self._pool.action_space.n)

    def _make_pool(self, seed: int):
        """Every stream gets its own SeedSequence-derived seed where envpool allows it;
        older envpool versions seed stream i with seed + i."""
        options = dict(self._config, num_envs=self.num_envs, batch_size=self.num_envs)
        if self._per_stream_seeds:
            seeds = stream_seeds(seed, self.num_envs) % np.uint32(2**31 - 1)
            options["env_seed"] = [int(s) for s in seeds]
        return _envpool().make(self.task_id, env_type="gymnasium", seed=int(seed), **options)

    def _in_stream_order(self, obs, info):
        """envpool returns streams in completion order; put them back in env_id order."""
        order = np.argsort(info["env_id"], kind="stable")
        image = obs[self._obs_key] if self._obs_key else obs
        return _channel_first(image)[order], order

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self._pool.close()
            self._pool = self._make_pool(seed)
        obs, info = self._pool.reset()
        self.stats.reset()
        obs, order = self._in_stream_order(obs, info)
        if self.life_loss_terminal:
            self._lives[:] = np.asarray(info["lives"])[order]
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._check_actions(actions).astype(np.int32)
        obs, reward, terminated, truncated, info = self._pool.step(actions, self._all_ids)
        obs, order = self._in_stream_order(obs, info)
        reward = np.asarray(reward, dtype=np.float32)[order]
        terminated = np.asarray(terminated, dtype=bool)[order]
        truncated = np.asarray(truncated, dtype=bool)[order] & ~terminated
        done = terminated | truncated  # (B,) the game is over
        stats = self.stats.update(reward, done)
        reset_obs = reset_info = None
        if done.any():
            finished = self._all_ids[done]
            raw, reset_info = self._pool.reset(finished)
            reset_obs, reset_order = self._in_stream_order(raw, reset_info)
        obs, final_obs = merge_final_obs(obs, reset_obs, done)
        if self.life_loss_terminal:
            lives = np.asarray(info["lives"])[order]  # (B,)
            terminated = terminated | ((lives < self._lives) & ~done)  # the game goes on
            if reset_info is not None:
                lives[done] = np.asarray(reset_info["lives"])[reset_order]
            self._lives = lives
        return StepResult(obs, reward, terminated, truncated, {**stats, "final_obs": final_obs})

    def close(self) -> None:
        self._pool.close()


def _game_id(name: str, suffix: str) -> str:
    return name if name.endswith(suffix) else f"{name}{suffix}"


def make_atari(
    game: str, num_envs: int, seed: int = 0, episodic_life: bool = False, **options: Any
) -> EnvpoolEnv:
    """`atari/<Game>`: 84x84 grey, 4-frame stack, action repeat 4, up to 30 no-op starts.

    episodic_life: a lost life is terminal for the learner, the game goes on (module doc).
    """
    return EnvpoolEnv(
        _game_id(game, "-v5"),
        num_envs,
        seed,
        life_loss_terminal=bool(episodic_life),
        **{**ATARI_DEFAULTS, **options},
    )


def make_procgen(
    game: str,
    num_envs: int,
    seed: int = 0,
    mode: str = "hard",
    split: str = "train",
    num_levels: int = 500,
    test_levels: int = 100_000,
    **options: Any,
) -> EnvpoolEnv:
    """`procgen/<game>`: 64x64 RGB, no action repeat. split "train" plays levels
    [0, num_levels); split "test" plays the disjoint range [num_levels, num_levels + test_levels)."""
    if mode not in PROCGEN_MODES:
        raise ConfigError(f"procgen mode must be one of {list(PROCGEN_MODES)}, got {mode!r}")
    if split not in ("train", "test"):
        raise ConfigError(f"procgen split must be 'train' or 'test', got {split!r}")
    try:
        _envpool().procgen  # noqa: B018  (imports the Qt-linked module)
    except ImportError as exc:
        raise ConfigError(f"{QT_HINT} ({exc})") from exc
    levels = (0, num_levels) if split == "train" else (num_levels, test_levels)
    task_id = f"{game.capitalize()}{PROCGEN_MODES[mode]}-v0"
    return EnvpoolEnv(
        task_id, num_envs, seed, start_level=levels[0], num_levels=levels[1], **options
    )


# MiniGrid's symbolic cell codes (minigrid.core.constants; envpool's port uses the same):
# object type 0..10 (unseen, empty, wall, floor, door, key, ball, box, goal, lava, agent),
# colour 0..5, door state 0..2.
MINIGRID_CODES = (11, 6, 3)
MINIGRID_ENCODINGS = ("onehot", "image")


def one_hot_grid(codes: np.ndarray, sizes: tuple[int, ...] = MINIGRID_CODES) -> np.ndarray:
    """(B, C, H, W) integer codes, channel c in [0, sizes[c]) -> (B, sum(sizes) * H * W) float32.

    The codes are categories, not intensities: as uint8 pixels scaled by 1/255 they would reach
    the network as values below 0.05 with a meaningless order.
    """
    b, c, h, w = codes.shape
    if c != len(sizes):
        raise ValueError(f"expected {len(sizes)} code channels, got {c}")
    out = np.zeros((b, sum(sizes), h, w), np.float32)
    offset = 0
    for channel, size in enumerate(sizes):
        plane = codes[:, channel].astype(np.int64)  # (B, H, W)
        if plane.size and (plane.min() < 0 or plane.max() >= size):
            raise ValueError(
                f"code channel {channel} out of range [0, {size}): {plane.min()}..{plane.max()}"
            )
        np.put_along_axis(out[:, offset : offset + size], plane[:, None], 1.0, axis=1)
        offset += size
    return out.reshape(b, -1)


class OneHotGrid(BatchedEnv):
    """Wraps a batched env of (C, H, W) symbolic grid codes; observations become one-hot vectors."""

    def __init__(self, env: BatchedEnv, sizes: tuple[int, ...] = MINIGRID_CODES):
        c, h, w = env.observation_spec.shape
        if c != len(sizes):
            raise ConfigError(
                f"expected {len(sizes)} code channels, got observations of shape {(c, h, w)}"
            )
        self.env, self.sizes, self.num_envs, self.num_actions = (
            env,
            sizes,
            env.num_envs,
            env.num_actions,
        )
        self.observation_spec = ArraySpec((sum(sizes) * h * w,), np.dtype(np.float32))

    def reset(self, seed: int | None = None) -> np.ndarray:
        return one_hot_grid(self.env.reset(seed), self.sizes)

    def step(self, actions: np.ndarray) -> StepResult:
        r = self.env.step(actions)
        obs, info = one_hot_grid(r.obs, self.sizes), dict(r.info)
        final = info.get("final_obs")
        if final is not None:  # the same array as obs when no stream finished
            info["final_obs"] = obs if final is r.obs else one_hot_grid(final, self.sizes)
        return r._replace(obs=obs, info=info)

    def close(self) -> None:
        self.env.close()


def make_minigrid(
    name: str, num_envs: int, seed: int = 0, obs_encoding: str = "onehot", **options: Any
) -> BatchedEnv:
    """`minigrid/MemoryS13Random` etc.: envpool's MiniGrid; falls back to the `minigrid`
    Gymnasium package through the gym adapter when envpool lacks it.

    `obs_encoding`: "onehot" (default; a float vector for the MLP stem) or "image" (the raw
    (3, 7, 7) uint8 codes, which the image stem would scale by 1/255 like pixels).
    """
    if obs_encoding not in MINIGRID_ENCODINGS:
        raise ConfigError(
            f"minigrid obs_encoding must be one of {list(MINIGRID_ENCODINGS)}, got {obs_encoding!r}"
        )
    task_id = name if name.startswith("MiniGrid-") else f"MiniGrid-{name}-v0"
    try:
        has_task = task_id in _envpool().list_all_envs()
    except ImportError:
        has_task = False
    if has_task:
        env: BatchedEnv = EnvpoolEnv(task_id, num_envs, seed, **options)
    else:
        from r2ac.envs.gym_adapter import GymEnv

        env = GymEnv(task_id, num_envs, seed, obs_key="image", **options)
    return OneHotGrid(env) if obs_encoding == "onehot" else env


def make_envpool(task_id: str, num_envs: int, seed: int = 0, **options: Any) -> EnvpoolEnv:
    """`envpool/<task id>`: any envpool task with a discrete action space, envpool defaults."""
    return EnvpoolEnv(task_id, num_envs, seed, **options)
