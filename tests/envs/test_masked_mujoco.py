"""Masked MuJoCo (`masked/<Env>-<P|V>`): which observation indices each id keeps, that the
kept values are the full task's, and a few training updates with `--preset control`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.envs.masked_mujoco import MASKED_ENVS, kept_indices, masked_env, masked_ids
from r2ac.envs.registry import _import_error
from r2ac.errors import ConfigError

NO_MUJOCO = _import_error("mujoco") or _import_error("gymnasium")
needs_mujoco = pytest.mark.skipif(
    bool(NO_MUJOCO),
    reason=f"mujoco is not installed ({NO_MUJOCO}); pip install -e '.[mujoco]'",
)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("env", list(MASKED_ENVS))
def test_positions_and_velocities_split_the_observation(env):
    positions, velocities = kept_indices(env, "P"), kept_indices(env, "V")
    size = MASKED_ENVS[env][2]
    assert positions + velocities == tuple(range(size))
    # qpos drops the root x (Ant: x and y, and has a quaternion where qvel has 3 rates)
    assert len(velocities) == len(positions) + 1


def test_ids_and_unknown_ids():
    assert len(masked_ids()) == 8 and "HalfCheetah-P" in masked_ids()
    for bad in ("HalfCheetah-X", "Humanoid-P", "HalfCheetah"):
        with pytest.raises(ConfigError, match="unknown masked MuJoCo task"):
            make(f"masked/{bad}", 1)


@needs_mujoco
@pytest.mark.parametrize("task", masked_ids())
def test_masked_observations_are_the_full_task_s_kept_indices(task):
    import gymnasium as gym

    env, mask = task.rsplit("-", 1)
    base_id, options, size, _ = MASKED_ENVS[env]
    full, masked = (
        gym.make(base_id, **options),
        masked_env(base_id, kept_indices(env, mask), **options),
    )
    obs_full, _ = full.reset(seed=3)
    obs, _ = masked.reset(seed=3)
    assert obs_full.shape == (size,) and masked.observation_space.shape == obs.shape
    np.testing.assert_array_equal(obs, obs_full[list(kept_indices(env, mask))])
    action = full.action_space.sample()
    step_full, step = full.step(action), masked.step(action)
    np.testing.assert_array_equal(step[0], step_full[0][list(kept_indices(env, mask))])
    assert step[1] == step_full[1]


@needs_mujoco
def test_train_and_evaluate_position_only_hopper(tmp_path):
    from r2ac.rl.harness import train_cli

    out = tmp_path / "run"
    args = ["--preset", "control", "--env", "masked/Hopper-P", "--total-frames", "1024"]
    args += ["--num-envs", "8", "--batch-size", "8", "--hidden-size", "16", "--log-every", "1"]
    args += ["--no-progress", "--eval-sets", "1", "--eval-episodes", "2"]
    assert train_cli.main([*args, "--out-dir", str(out)]) == 0
    greedy = json.loads((out / "eval.json").read_text())
    assert greedy["actions"] == "greedy" and math.isfinite(greedy["mean"])
