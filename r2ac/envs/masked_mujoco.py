"""Masked MuJoCo: Gymnasium's MuJoCo locomotion tasks that see positions only or velocities
only (the partially observed control benchmark of the RTU paper, after Ni et al. 2022).

`masked/<Env>-P` keeps the joint positions of the observation, `masked/<Env>-V` the joint
velocities, for Env in HalfCheetah, Hopper, Walker2d, Ant (Gymnasium's v5 tasks through
the `mujoco` package: `pip install -e '.[mujoco]'`). Actions (Box, [-1, 1]^A), rewards,
episode ends (1,000 steps, or a fall for Hopper, Walker2d and Ant) are the v5 task's.

The v5 observation (root x excluded, Gymnasium's default) is qpos[1:] then qvel; Ant's is
qpos[2:], qvel, then 78 contact forces, which the masked Ant leaves out of the full
observation first (`include_cfrc_ext_in_observation=False`). Kept indices of the v5
observation:

| env | observation | -P keeps (positions) | -V keeps (velocities) |
|---|---|---|---|
| HalfCheetah | 17 | 0-7: rootz, rooty, 6 joint angles | 8-16: root vx, vz, vangle, 6 joint velocities |
| Hopper | 11 | 0-4: rootz, rooty, 3 joint angles | 5-10: root vx, vz, vangle, 3 joint velocities |
| Walker2d | 17 | 0-7: rootz, rooty, 6 joint angles | 8-16: root vx, vz, vangle, 6 joint velocities |
| Ant | 27 | 0-12: torso z, torso quaternion (4), 8 joint angles | 13-26: torso velocity (3), angular velocity (3), 8 joint velocities |
"""

from __future__ import annotations

from typing import Any

from r2ac.envs.gym_adapter import GymEnv
from r2ac.errors import ConfigError, require

# env -> (Gymnasium id, options of gymnasium.make, observation size, positions kept)
MASKED_ENVS: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "HalfCheetah": ("HalfCheetah-v5", {}, 17, 8),
    "Hopper": ("Hopper-v5", {}, 11, 5),
    "Walker2d": ("Walker2d-v5", {}, 17, 8),
    "Ant": ("Ant-v5", {"include_cfrc_ext_in_observation": False}, 27, 13),
}
MASKS = {"P": "positions", "V": "velocities"}
NAMESPACE = "r2ac"  # the Gymnasium ids this module registers: r2ac/<Env>-<P|V>-v0


def masked_ids() -> list[str]:
    """Every masked task, as `masked/<task>` names it."""
    return [f"{env}-{mask}" for env in MASKED_ENVS for mask in MASKS]


def kept_indices(env: str, mask: str) -> tuple[int, ...]:
    """Indices of the v5 observation that `<env>-<mask>` keeps."""
    _, _, size, positions = MASKED_ENVS[env]
    return tuple(range(positions)) if mask == "P" else tuple(range(positions, size))


def parse_task(task: str) -> tuple[str, str]:
    """`HalfCheetah-P` -> ("HalfCheetah", "P"); a ConfigError listing the tasks otherwise."""
    env, _, mask = task.rpartition("-")
    if env not in MASKED_ENVS or mask not in MASKS:
        raise ConfigError(
            f"unknown masked MuJoCo task {task!r}; choose one of "
            f"{', '.join(f'masked/{t}' for t in masked_ids())}"
        )
    return env, mask


def masked_env(base_id: str, keep: tuple[int, ...], **options: Any):
    """One Gymnasium env `base_id` whose observations keep only the indices `keep`."""
    gym = require("gymnasium", "gymnasium[mujoco]", "mujoco")
    require("mujoco", "mujoco", "mujoco")
    env = gym.make(base_id, **options)
    space, index = env.observation_space, list(keep)
    kept = gym.spaces.Box(space.low[index], space.high[index], dtype=space.dtype)
    return gym.wrappers.TransformObservation(env, lambda obs: obs[index], kept)


def register(env: str, mask: str) -> str:
    """Register `r2ac/<env>-<mask>-v0` with Gymnasium (once); its id."""
    gym = require("gymnasium", "gymnasium[mujoco]", "mujoco")
    env_id = f"{NAMESPACE}/{env}-{mask}-v0"
    if env_id not in gym.registry:
        base_id, options, _, _ = MASKED_ENVS[env]
        kwargs = {"base_id": base_id, "keep": kept_indices(env, mask), **options}
        gym.register(id=env_id, entry_point=masked_env, kwargs=kwargs)
    return env_id


def make_masked(task: str, num_envs: int, seed: int = 0, **options: Any) -> GymEnv:
    """`masked/<Env>-<P|V>`; options go to `gymnasium.make` of the v5 task."""
    env, mask = parse_task(task)
    require("mujoco", "mujoco", "mujoco")
    return GymEnv(register(env, mask), num_envs, seed, **options)
