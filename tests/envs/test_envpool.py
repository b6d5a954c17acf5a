"""envpool adapters: shapes, seeding, and the hidden one-step-late reset."""

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.envs.envpool_adapter import one_hot_grid
from r2ac.errors import ConfigError

envpool = pytest.importorskip("envpool")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def run(env, actions):
    """Stacked results of stepping env through actions (T, B)."""
    results = [env.step(a) for a in actions]
    return {
        k: np.stack([getattr(r, k) for r in results])
        for k in ("obs", "reward", "terminated", "truncated")
    }, results


def test_late_reset_is_hidden_no_action_is_dropped():
    """CartPole pays 1 for every executed step; envpool's own late reset would pay 0.
    Pushing one way ends episodes within ~10 steps, so many boundaries are crossed."""
    env = make("envpool/CartPole-v1", 4, seed=0)
    env.reset()
    steps = 200
    data, results = run(env, np.ones((steps, 4), dtype=np.int64))
    np.testing.assert_array_equal(data["reward"], 1.0)
    done = data["terminated"] | data["truncated"]
    assert done.sum() >= 4 * 10
    # Episode lengths add up to the steps taken before each stream's last boundary.
    lengths = np.stack([r.info["episode_length"] for r in results])  # (T, B)
    last = steps - 1 - np.argmax(done[::-1], axis=0)
    np.testing.assert_array_equal(lengths.sum(axis=0), last + 1)
    # The obs after a done is a fresh start: CartPole starts within +-0.05 of upright.
    assert np.abs(data["obs"][done]).max() <= 0.05
    assert np.abs(np.stack([r.info["final_obs"] for r in results])[done]).max() > 0.2


def test_raw_envpool_would_drop_an_action():
    """The behaviour the adapter hides: after done, raw envpool returns a 0-reward reset step."""
    pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=1, seed=0)
    pool.reset()
    rewards, dones = [], []
    for _ in range(40):
        _, reward, terminated, truncated, _ = pool.step(np.ones(1, dtype=np.int32))
        rewards.append(reward[0])
        dones.append(terminated[0] or truncated[0])
    first_done = dones.index(True)
    assert rewards[first_done + 1] == 0.0


def test_seeding_is_deterministic_and_streams_differ():
    actions = np.random.default_rng(0).integers(0, 2, (120, 3))
    first, second = make("envpool/CartPole-v1", 3, seed=5), make("envpool/CartPole-v1", 3, seed=5)
    np.testing.assert_array_equal(first.reset(), second.reset())
    a, b = run(first, actions)[0], run(second, actions)[0]
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["obs"][:, 0], a["obs"][:, 1])
    other = make("envpool/CartPole-v1", 3, seed=6).reset()
    assert not np.array_equal(other, first.reset(seed=5)[:, :])
    np.testing.assert_array_equal(first.reset(seed=5), second.reset(seed=5))


def test_time_limit_is_truncation():
    env = make("envpool/CartPole-v1", 2, seed=0, max_episode_steps=5)
    # Alternating pushes keep CartPole up for 5 steps, so every episode is cut by the limit.
    env.reset()
    data, results = run(env, np.tile([[0, 0], [1, 1]], (6, 1)))
    assert data["truncated"][4].all() and data["truncated"][9].all()
    assert not data["terminated"].any()
    np.testing.assert_array_equal(results[4].info["episode_length"], 5)


def test_atari_shapes_dtypes_and_determinism():
    env = make("atari/Breakout", 2, seed=1)
    obs = env.reset()
    assert env.observation_spec.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert obs.shape == (2, 4, 84, 84) and env.num_actions == 4
    actions = np.random.default_rng(0).integers(0, 4, (40, 2))
    a = run(env, actions)[0]
    env.reset(seed=1)
    b = run(env, actions)[0]
    np.testing.assert_array_equal(a["obs"], b["obs"])
    assert a["reward"].min() >= 0 and a["obs"].max() > 0


def test_procgen_chaser_hard_train_and_test_levels():
    try:
        envpool.procgen.ProcgenEnvSpec  # noqa: B018
    except ImportError:
        pytest.skip("ProcGen needs libqt5gui5")
    env = make("procgen/chaser", 2, seed=0)
    obs = env.reset()
    assert obs.shape == (2, 3, 64, 64) and obs.dtype == np.uint8 and env.num_actions == 15
    assert env._config["num_levels"] == 500 and env._config["start_level"] == 0
    test = make("procgen/chaser", 2, seed=0, split="test")
    assert test._config["start_level"] == 500
    data = run(env, np.random.default_rng(0).integers(0, 15, (30, 2)))[0]
    assert data["reward"].min() >= 0 and data["reward"].max() <= 10


@pytest.mark.parametrize("name", ["minigrid/MemoryS7", "minigrid/MemoryS17Random"])
def test_minigrid_memory(name):
    env = make(name, 3, seed=2, max_episode_steps=30)
    obs = env.reset()
    assert obs.shape == (3, 980) and obs.dtype == np.float32 and env.num_actions == 7
    cells = obs.reshape(3, 20, 49)
    # one object, one colour and one state code per cell of the 7x7 view
    for lo, hi in ((0, 11), (11, 17), (17, 20)):
        assert np.array_equal(cells[:, lo:hi].sum(axis=1), np.ones((3, 49)))
    data, results = run(env, np.random.default_rng(0).integers(0, 3, (70, 3)))
    done = data["terminated"] | data["truncated"]
    assert done.sum(axis=0).min() >= 2  # episodes end by success, failure or the time limit
    assert data["reward"].min() >= 0 and data["reward"].max() <= 1
    lengths = np.stack([r.info["episode_length"] for r in results])[done]
    assert lengths.max() <= 30 and lengths.min() >= 1


def test_minigrid_one_hot_encodes_the_raw_codes():
    onehot = make("minigrid/MemoryS11", 2, seed=5)
    image = make("minigrid/MemoryS11", 2, seed=5, obs_encoding="image")
    assert image.observation_spec.shape == (3, 7, 7) and image.observation_spec.dtype == np.uint8
    actions = np.random.default_rng(1).integers(0, 7, (40, 2))
    a, b = onehot.reset(), image.reset()
    for step in range(len(actions) + 1):
        assert np.array_equal(a, one_hot_grid(b))
        codes = a.reshape(2, 20, 7, 7)
        assert np.array_equal(codes[:, :11].argmax(1), b[:, 0])  # object type of every cell
        assert np.array_equal(codes[:, 11:17].argmax(1), b[:, 1]) and np.array_equal(
            codes[:, 17:].argmax(1), b[:, 2]
        )
        if step < len(actions):
            ra, rb = onehot.step(actions[step]), image.step(actions[step])
            assert np.array_equal(ra.info["final_obs"], one_hot_grid(rb.info["final_obs"]))
            a, b = ra.obs, rb.obs


def test_one_hot_grid_rejects_codes_out_of_range():
    codes = np.zeros((1, 3, 2, 2), np.uint8)
    codes[0, 2, 1, 1] = 3  # the state channel has 3 values
    with pytest.raises(ValueError, match="channel 2"):
        one_hot_grid(codes)
    with pytest.raises(ConfigError, match="obs_encoding"):
        make("minigrid/MemoryS7", 1, obs_encoding="pixels")


def test_atari_episodic_life_ends_lives_for_the_learner_not_games():
    """episodic_life=True: a lost life is `terminated` without a reset (the next frame is the
    same game, one life fewer), and episode stats count whole games. Without it the same
    seed and actions give the same frames, with `terminated` only at game over."""
    actions = np.random.default_rng(0).integers(0, 4, (900, 2))
    plain, life = (
        make("atari/Breakout", 2, seed=3),
        make("atari/Breakout", 2, seed=3, episodic_life=True),
    )
    np.testing.assert_array_equal(plain.reset(), life.reset())
    (a, ra), (b, rb) = run(plain, actions), run(life, actions)
    np.testing.assert_array_equal(a["obs"], b["obs"])  # the game is not restarted at a life
    np.testing.assert_array_equal(a["reward"], b["reward"])
    assert (b["terminated"] & ~a["terminated"]).sum() >= 4 * 2  # lost lives, 5 per game
    assert not (a["terminated"] & ~b["terminated"]).any()
    for x, y in zip(ra, rb):  # whole-game returns and lengths in both
        np.testing.assert_array_equal(x.info["episode_return"], y.info["episode_return"])
        np.testing.assert_array_equal(x.info["episode_length"], y.info["episode_length"])
    assert a["terminated"].sum() >= 1  # at least one game over inside the window
