"""Gymnasium adapter (CartPole, POPGym, MiniGrid through gymnasium)."""

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.errors import ConfigError

pytest.importorskip("gymnasium")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_same_step_reset_and_truncation():
    env = make("gym/CartPole-v1", 3, seed=0, max_episode_steps=12)
    obs = env.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32 and env.num_actions == 2
    results = [env.step(np.array([0, 1, b % 2])) for b in range(40)]
    reward = np.stack([r.reward for r in results])
    np.testing.assert_array_equal(reward, 1.0)  # every action is executed
    truncated = np.stack([r.truncated for r in results])
    terminated = np.stack([r.terminated for r in results])
    assert truncated[:, 2].sum() == 3 and not terminated[:, 2].any()  # alternating: time limit
    assert terminated[:, 0].sum() >= 3  # constant push: the pole falls
    done = truncated | terminated
    starts = np.stack([r.obs for r in results])[done]
    assert np.abs(starts).max() <= 0.05  # CartPole's initial state range


def test_seeding_determinism():
    actions = np.random.default_rng(0).integers(0, 2, (50, 2))
    runs = []
    for _ in range(2):
        env = make("gym/CartPole-v1", 2, seed=3)
        runs.append([env.reset()] + [env.step(a).obs for a in actions])
    np.testing.assert_array_equal(np.stack(runs[0]), np.stack(runs[1]))
    assert not np.array_equal(runs[0][0][0], runs[0][0][1])


def test_unknown_id_is_a_config_error():
    with pytest.raises(ConfigError):
        make("gym/NoSuchEnv-v9", 1)
    # continuous and other action spaces: tests/envs/test_gym_spaces.py


def test_popgym_repeat_previous():
    pytest.importorskip("popgym")
    env = make("gym/popgym-RepeatPreviousEasy-v0", 4, seed=1)
    obs = env.reset()
    assert obs.shape == (4, 4) and obs.dtype == np.float32 and env.num_actions == 4
    np.testing.assert_array_equal(obs.sum(axis=1), 1)  # Discrete(4) -> one-hot
    returns = []
    for a in np.random.default_rng(0).integers(0, 4, (200, 4)):
        result = env.step(a)
        assert np.all(np.abs(result.reward) <= 1)
        returns += list(result.info["episode_return"][~np.isnan(result.info["episode_return"])])
    assert len(returns) >= 4 and all(-1.0 <= r <= 1.0 for r in returns)


def test_minigrid_through_gymnasium_gives_channel_first_images():
    pytest.importorskip("minigrid")
    env = make("gym/MiniGrid-MemoryS7-v0", 2, seed=0, obs_key="image")
    obs = env.reset()
    assert obs.shape == (2, 3, 7, 7) and obs.dtype == np.uint8


def test_minatar_breakout_registers_on_demand_and_is_seeded():
    pytest.importorskip("minatar")
    actions = np.random.default_rng(1).integers(0, 3, (300, 2))
    runs, rewards = [], []
    for _ in range(2):  # the second make must not re-register (or fail on) the ids
        env = make("gym/MinAtar/Breakout-v1", 2, seed=5)
        obs = env.reset()
        assert obs.shape == (2, 400) and obs.dtype == np.float32 and env.num_actions == 3
        steps = [env.step(a) for a in actions]
        runs.append(np.stack([obs] + [s.obs for s in steps]))
        rewards.append(np.stack([s.reward for s in steps]))
    np.testing.assert_array_equal(runs[0], runs[1])  # sticky actions drawn from the seed
    assert set(np.unique(runs[0])) <= {0.0, 1.0}  # 10x10x4 binary channels, flattened
    assert rewards[0].sum() > 0  # random play breaks bricks within 300 steps
    assert not np.array_equal(runs[0][:, 0], runs[0][:, 1])  # streams differ
