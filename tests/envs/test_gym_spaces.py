"""Gymnasium action spaces through the adapter: Box (normalised, clipped and scaled),
MultiDiscrete, Dict/Tuple observations flattened, unsupported spaces refused in one line."""

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.errors import ConfigError

gym = pytest.importorskip("gymnasium")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _SpacesEnv(gym.Env):
    """Dict observations; the action space is given; one-step episodes recording the action."""

    def __init__(self, action_space=None):
        spaces = gym.spaces
        self.action_space = action_space or spaces.Tuple([spaces.Discrete(2)] * 2)
        self.observation_space = spaces.Dict(
            {"pos": spaces.Box(-1.0, 1.0, (2,), np.float32), "flag": spaces.Discrete(3)}
        )
        self.last = None

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.zeros(2, np.float32), "flag": 1}, {}

    def step(self, action):
        self.last = action
        return {"pos": np.ones(2, np.float32), "flag": 2}, 0.0, True, False, {}


def _register(name, **kwargs):
    if name not in gym.registry:
        gym.register(id=name, entry_point=lambda **kw: _SpacesEnv(**{**kwargs, **kw}))


def test_pendulum_takes_normalised_box_actions():
    env = make("gym/Pendulum-v1", 2, seed=0)
    space = env.action_space
    assert space.kind == "box" and space.action_shape == (1,) and space.param_size == 2
    env.reset()
    env.step(np.array([[0.5], [7.0]]))  # -> torques 1.0 and 2.0 (clipped to the bound)
    torques = [float(e.unwrapped.last_u) for e in env.envs]
    assert torques == [1.0, 2.0]
    with pytest.raises(ValueError, match="shape"):
        env.step(np.array([0.5, 0.5]))


@pytest.mark.parametrize(
    ("env_id", "nvec"),
    [("popgym-BattleshipEasy-v0", (8, 8)), ("popgym-MineSweeperEasy-v0", (4, 4))],
)
def test_popgym_multi_discrete(env_id, nvec):
    pytest.importorskip("popgym")
    env = make(f"gym/{env_id}", 3, seed=1)
    assert env.action_space.kind == "multi_discrete" and env.action_space.nvec == nvec
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(20):
        result = env.step(rng.integers(0, nvec[0], (3, 2)))
        assert result.obs.shape[0] == 3


def test_dict_observations_are_flattened_and_multi_binary_is_passed_as_bits():
    _register("R2acMultiBinary-v0", action_space=gym.spaces.MultiBinary([2, 2]))
    env = make("gym/R2acMultiBinary-v0", 1, seed=0)
    assert env.observation_spec.shape == (5,)  # one-hot flag (3) + pos (2), keys sorted
    np.testing.assert_array_equal(env.reset(), [[0.0, 1.0, 0.0, 0.0, 0.0]])
    assert env.action_space.kind == "multi_binary" and env.action_space.dims == 4
    env.step(np.array([[1, 0, 0, 1]]))
    np.testing.assert_array_equal(env.envs[0].unwrapped.last, [[1, 0], [0, 1]])


def test_unsupported_action_space_is_refused_in_one_line():
    _register("R2acTupleActions-v0")
    with pytest.raises(ConfigError, match=r"action space Tuple\(Discrete\(2\)") as err:
        make("gym/R2acTupleActions-v0", 1)
    assert "\n" not in str(err.value)
