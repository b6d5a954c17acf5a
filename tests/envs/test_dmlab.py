"""DMLab adapter: a clear error without deepmind_lab; the logic against a fake Lab."""

import importlib.util
import sys
import types

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.envs.dmlab import ACTION_SET
from r2ac.errors import MissingDependencyError

HAS_DMLAB = importlib.util.find_spec("deepmind_lab") is not None


@pytest.mark.skipif(HAS_DMLAB, reason="deepmind_lab is installed")
def test_missing_deepmind_lab_says_how_to_install():
    with pytest.raises(MissingDependencyError, match="bazel build"):
        make("dmlab/rooms_watermaze", 1)


class FakeLab:
    """Episodes of 3 agent steps; the frame encodes (level seed, step) in its pixels."""

    def __init__(self, level, observations, config, renderer):
        self.level, self.width, self.height = level, int(config["width"]), int(config["height"])
        self.calls = []

    def reset(self, seed):
        self.seed, self.t = seed, 0

    def observations(self):
        frame = np.full((self.height, self.width, 3), self.t, dtype=np.uint8)
        frame[0, 0, 0] = self.seed % 251
        return {"RGB_INTERLEAVED": frame}

    def step(self, action, num_steps):
        self.calls.append((tuple(action), num_steps))
        self.t += 1
        return float(num_steps * (action[3] == 1))

    def is_running(self):
        return self.t < 3

    def close(self):
        pass


@pytest.fixture
def fake_lab(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", types.SimpleNamespace(Lab=FakeLab))


def test_dmlab_logic_with_fake_lab(fake_lab):
    env = make("dmlab/rooms_watermaze", 2, seed=0)
    assert env.envs[0].level == "contributed/dmlab30/rooms_watermaze"
    obs = env.reset()
    assert obs.shape == (2, 3, 72, 96) and obs.dtype == np.uint8 and env.num_actions == 9
    assert obs[0, 0, 0, 0] != obs[1, 0, 0, 0]  # per-stream level seeds
    results = [env.step(np.array([0, 4])) for _ in range(3)]
    assert env.envs[0].calls[0] == (tuple(ACTION_SET[0]), 4)  # forward, repeated 4 times
    np.testing.assert_array_equal([r.reward[0] for r in results], 4.0)
    assert results[2].terminated.all() and not results[1].terminated.any()
    np.testing.assert_array_equal(results[2].obs[:, 1], 0)  # next episode's first frame
    np.testing.assert_array_equal(results[2].info["final_obs"][:, 1], 2)
    np.testing.assert_array_equal(results[2].info["episode_length"], 3)
    again = make("dmlab/rooms_watermaze", 2, seed=0).reset()
    np.testing.assert_array_equal(again, obs)


def test_unknown_dmlab_option_is_a_config_error_even_without_deepmind_lab():
    from r2ac.envs import make
    from r2ac.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown options \\['delay'\\]"):
        make("dmlab/rooms_watermaze", 1, 0, delay=3)
