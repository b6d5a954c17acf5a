"""Protocol properties of the built-in tasks: shapes, seeding, resets, state, speed."""

import subprocess
import sys
import time

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.envs.builtin import DelayedCue, Watermaze
from r2ac.errors import ConfigError

from .env_helpers import assert_resumes_bit_exactly

TASKS = [
    ("builtin/delayed-cue", {}),
    ("builtin/delayed-cue", {"variant": "nonmatch", "num_cues": 4}),
    ("builtin/watermaze", {}),
    ("builtin/watermaze", {"size": 4, "episode_steps": 9, "last_action": True}),
    ("builtin/memory-chain", {"length": 5}),
    ("builtin/k-memory-chain", {"k": 3, "length": 10}),
]


def rollout(env, steps, seed=0):
    """Observations (T+1, B, D), rewards, dones of random actions from a fixed generator."""
    rng = np.random.default_rng(seed)
    observations, rewards, dones = [env.reset(seed=7)], [], []
    for _ in range(steps):
        result = env.step(rng.integers(0, env.num_actions, env.num_envs))
        observations.append(result.obs)
        rewards.append(result.reward)
        dones.append(result.terminated | result.truncated)
    return np.stack(observations), np.stack(rewards), np.stack(dones)


@pytest.mark.parametrize(("name", "options"), TASKS)
def test_shapes_dtypes_and_info(name, options):
    env = make(name, 5, seed=1, **options)
    obs = env.reset()
    assert obs.shape == (5, *env.observation_spec.shape) and obs.dtype == np.float32
    result = env.step(np.zeros(5, dtype=np.int64))
    assert result.reward.shape == (5,) and result.reward.dtype == np.float32
    assert result.terminated.dtype == bool and result.truncated.dtype == bool
    assert result.info["episode_return"].dtype == np.float64
    assert result.info["episode_length"].dtype == np.int64
    assert result.info["final_obs"].shape == obs.shape


@pytest.mark.parametrize(("name", "options"), TASKS)
def test_same_seed_same_trajectory_and_batch_independence(name, options):
    a = rollout(make(name, 6, seed=0, **options), 300)
    b = rollout(make(name, 6, seed=0, **options), 300)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    # Stream b depends only on its own seed and actions: 3 streams reproduce the first 3
    # when they receive the same actions.
    env6, env3 = make(name, 6, seed=0, **options), make(name, 3, seed=0, **options)
    obs6, obs3 = env6.reset(seed=11), env3.reset(seed=11)
    rng = np.random.default_rng(1)
    for _ in range(300):
        actions = rng.integers(0, env6.num_actions, 6)
        obs6, obs3 = env6.step(actions).obs, env3.step(actions[:3]).obs
        np.testing.assert_array_equal(obs6[:3], obs3)
    # Different streams and different seeds differ.
    assert not np.array_equal(a[0][:, :3], a[0][:, 3:])
    env = make(name, 6, seed=0, **options)
    env.reset(seed=8)
    assert not np.array_equal(
        env.get_state()["seeds"], make(name, 6, 0, **options).get_state()["seeds"]
    )


@pytest.mark.parametrize(("name", "options"), TASKS)
def test_get_set_state_resumes_bit_exactly(name, options):
    env = make(name, 4, seed=3, **options)
    rollout(env, 77)
    actions = np.random.default_rng(5).integers(0, env.num_actions, (150, 4))
    assert_resumes_bit_exactly(env, make(name, 4, seed=99, **options), actions)


def test_delayed_cue_episode_structure():
    delay = 10
    env = DelayedCue(3, seed=0, delay=delay)
    obs = env.reset()
    cue = obs[:, :2].argmax(axis=1)
    np.testing.assert_array_equal(obs[:, 4], 1)  # cue phase flag
    for _ in range(delay):
        result = env.step(np.zeros(3, np.int64))
        assert not result.terminated.any() and not result.reward.any()
        np.testing.assert_array_equal(result.obs[:, :4], 0)  # blank during the delay
        np.testing.assert_array_equal(result.obs[:, 5], 1)
    result = env.step(np.zeros(3, np.int64))
    assert not result.terminated.any()
    np.testing.assert_array_equal(result.obs[:, 6], 1)  # choice phase flag
    actions = np.array([cue[0], 1 - cue[1], cue[2]])
    result = env.step(actions)
    np.testing.assert_array_equal(result.reward, [1, -1, 1])
    assert result.terminated.all() and not result.truncated.any()
    np.testing.assert_array_equal(result.info["episode_length"], delay + 2)
    np.testing.assert_array_equal(result.info["episode_return"], [1, -1, 1])
    np.testing.assert_array_equal(result.obs[:, 4], 1)  # already the next episode's cue
    np.testing.assert_array_equal(result.info["final_obs"][:, 4], 0)


def test_nonmatch_choice_shows_sample_and_novel_object():
    env = DelayedCue(50, seed=2, delay=3, num_cues=5, variant="nonmatch")
    sample = env.reset()[:, :5].argmax(axis=1)
    for _ in range(4):  # the delay, then the choice observation
        obs = env.step(np.zeros(50, np.int64)).obs
    slot_a, slot_b = obs[:, :5].argmax(axis=1), obs[:, 5:10].argmax(axis=1)
    assert np.all((slot_a == sample) != (slot_b == sample))  # exactly one slot is the sample
    novel_slot = (slot_a == sample).astype(np.int64)
    result = env.step(novel_slot)
    np.testing.assert_array_equal(result.reward, 1)
    assert 0 < novel_slot.mean() < 1


def test_watermaze_goal_reward_teleport_and_time_limit():
    env = Watermaze(2, seed=4, size=4, episode_steps=30)
    env.reset()
    env.pos[:] = env.goal - 1 + 2 * (env.goal % 4 == 0)  # a horizontal neighbour
    move = np.where(env.goal % 4 == 0, 2, 3)
    result = env.step(move)
    np.testing.assert_array_equal(result.reward, 1)
    assert np.all(env.pos != env.goal)
    np.testing.assert_array_equal(result.obs[:, -1], 1)  # last reward shown
    for _ in range(28):
        result = env.step(np.zeros(2, np.int64))
        assert not (result.terminated | result.truncated).any()
        assert set(np.unique(result.reward)) <= {0.0, 1.0}
    result = env.step(np.zeros(2, np.int64))
    assert result.truncated.all() and not result.terminated.any()
    np.testing.assert_array_equal(result.info["episode_length"], 30)
    assert np.isnan(env.step(np.zeros(2, np.int64)).info["episode_return"]).all()


def test_watermaze_last_action_is_observed_and_cleared_at_episode_start():
    env = Watermaze(3, seed=2, size=4, episode_steps=5, last_action=True)
    plain = Watermaze(3, seed=2, size=4, episode_steps=5)
    obs, ref = env.reset(), plain.reset()
    assert obs.shape == (3, 2 * 4 + 1 + 4)
    np.testing.assert_array_equal(obs[:, :9], ref)  # the same task, four more entries
    assert not obs[:, 9:].any()  # no action yet
    for step in range(1, 11):
        actions = np.array([0, 2, 3]) if step % 2 else np.array([1, 3, 0])
        result, ref = env.step(actions), plain.step(actions)
        np.testing.assert_array_equal(result.obs[:, :9], ref.obs)
        if step % 5:  # inside an episode: one-hot of the action just taken
            np.testing.assert_array_equal(result.obs[:, 9:], np.eye(4)[actions])
        else:  # the time limit ended it: the final obs shows the action, the new one none
            assert result.truncated.all() and not result.obs[:, 9:].any()
            np.testing.assert_array_equal(result.info["final_obs"][:, 9:], np.eye(4)[actions])


def test_bad_names_and_options_raise_config_error():
    for name, options in [
        ("builtin/nope", {}),
        ("nope/x", {}),
        ("builtin", {}),
        ("builtin/delayed-cue", {"delay_steps": 3}),
        ("builtin/delayed-cue", {"variant": "x"}),
        ("builtin/watermaze", {"last_action": 1}),
    ]:
        with pytest.raises(ConfigError):
            make(name, 2, 0, **options)
    with pytest.raises(ValueError):
        make("builtin/watermaze", 2, 0).step(np.array([0, 4]))


def test_importing_envs_loads_no_backend():
    code = (
        "import sys, r2ac.envs; r2ac.envs.make('builtin/watermaze', 2, 0); "
        "print(sorted(m for m in ('envpool', 'gymnasium', 'deepmind_lab', 'torch') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "name",
    ["builtin/delayed-cue", "builtin/watermaze", "builtin/memory-chain", "builtin/k-memory-chain"],
)
def test_throughput_above_100k_steps_per_second(name):
    env = make(name, 256, seed=0)
    env.reset()
    actions = np.random.default_rng(0).integers(0, env.num_actions, (64, 256))
    start = time.perf_counter()
    for i in range(200):
        env.step(actions[i % 64])
    rate = 200 * 256 / (time.perf_counter() - start)
    assert rate > 100_000, rate
