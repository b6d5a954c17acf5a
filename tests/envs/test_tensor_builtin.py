"""The tensor forms of the built-in tasks (r2ac/envs/tensor_builtin.py) give the numpy envs'
bits: the same obs, rewards, flags, final observations and episode stats, step for step, with
the previous-action input and without, seeded per agent and per batch, eager and compiled."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from r2ac.envs import make
from r2ac.envs.builtin import MemoryChain
from r2ac.envs.tensor_builtin import (
    TensorBuiltinEnv,
    agent_reset,
    agent_stream_seeds,
    obs_width,
    reset,
    step,
    tensor_params,
)
from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig
from r2ac.rl.stream.envs import PreviousActionInput, make_agent_envs

CASES = [
    ("memory-chain", {"length": 2}),
    ("memory-chain", {"length": 7}),
    ("memory-chain", {"length": 32}),
    ("k-memory-chain", {"k": 1, "length": 2}),
    ("k-memory-chain", {"k": 3, "length": 9}),
    ("k-memory-chain", {"k": 8, "length": 64}),
    ("delayed-cue", {"delay": 0}),
    ("delayed-cue", {"delay": 5, "num_cues": 4}),
    ("delayed-cue", {"delay": 3, "num_cues": 3, "variant": "nonmatch"}),
    ("watermaze", {"size": 3, "episode_steps": 17}),
    ("watermaze", {"size": 5, "episode_steps": 40, "last_action": True}),
]


def numpy_agent_envs(task: str, options: dict, seeds: list[int], prev_action: bool):
    """The streaming runtime's own envs for agents seeded `seeds` (`make_agent_envs`: one
    batched numpy env, stream k seeded as `make(..., 1, seeds[k])`, with --prev-action
    behind `PreviousActionInput`)."""
    text = tuple(f"{key}={str(value).lower()}" for key, value in options.items())
    cfg = TrainConfig.make(env=f"builtin/{task}", env_options=text, prev_action=prev_action)
    env = make_agent_envs(cfg, seeds)
    assert isinstance(env, PreviousActionInput) == prev_action
    return env


def assert_steps_equal(env, params, state, obs, steps: int, rng, step_fn=step) -> None:
    """Step the numpy env and the tensor functions side by side with random actions; every
    output must be equal, bit for bit (NaN where no episode ended)."""
    np.testing.assert_array_equal(obs.numpy(), env.reset())
    k, ended = env.num_envs, 0
    for _ in range(steps):
        actions = rng.integers(0, env.num_actions, k)
        want = env.step(actions)
        out = step_fn(params, state, torch.from_numpy(actions))
        state = out.state
        np.testing.assert_array_equal(out.obs.numpy(), want.obs)
        np.testing.assert_array_equal(out.reward.numpy(), want.reward)
        assert out.reward.dtype == torch.float32 and out.obs.dtype == torch.float32
        np.testing.assert_array_equal(out.terminated.numpy(), want.terminated)
        np.testing.assert_array_equal(out.truncated.numpy(), want.truncated)
        np.testing.assert_array_equal(out.final_obs.numpy(), want.info["final_obs"])
        np.testing.assert_array_equal(out.episode_return.numpy(), want.info["episode_return"])
        np.testing.assert_array_equal(out.episode_length.numpy(), want.info["episode_length"])
        ended += int((want.terminated | want.truncated).sum())
    assert ended > k  # episodes ended and restarted in the comparison


@pytest.mark.parametrize("prev_action", [True, False])
@pytest.mark.parametrize(("task", "options"), CASES)
def test_tensor_env_equals_numpy_env_with_agent_seeds(task, options, prev_action):
    seeds = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    env = numpy_agent_envs(task, options, seeds, prev_action)
    params = tensor_params(task, prev_action, **options)
    assert obs_width(params) == env.observation_spec.shape[0]
    state, obs = agent_reset(params, seeds)
    assert_steps_equal(env, params, state, obs, 1500, np.random.default_rng(len(options)))


def test_memory_chain_32_many_seeds_and_streams():
    seeds = list(range(100, 116))
    env = numpy_agent_envs("memory-chain", {"length": 32}, seeds, prev_action=True)
    params = tensor_params("memory-chain", True, length=32)
    state, obs = agent_reset(params, seeds)
    assert_steps_equal(env, params, state, obs, 4000, np.random.default_rng(1))


def test_stream_k_alone_equals_stream_k_in_the_batch():
    params = tensor_params("k-memory-chain", True, k=2, length=5)
    seeds = [21, 22, 23]
    state, _ = reset(params, agent_stream_seeds(seeds))
    alone, _ = reset(params, agent_stream_seeds(seeds[1:2]))
    rng = np.random.default_rng(0)
    for _ in range(50):
        actions = torch.from_numpy(rng.integers(0, 2, 3))
        out, one = step(params, state, actions), step(params, alone, actions[1:2])
        state, alone = out.state, one.state
        for name in ("obs", "reward", "final_obs", "episode_return", "episode_length"):
            torch.testing.assert_close(
                getattr(out, name)[1:2], getattr(one, name), rtol=0, atol=0, equal_nan=True
            )


@pytest.mark.parametrize(("task", "options"), [CASES[2], CASES[5], CASES[8], CASES[10]])
def test_adapter_is_the_numpy_env_behind_previous_action_input(task, options):
    numpy_env = PreviousActionInput(make(f"builtin/{task}", 5, 17, **options))
    env = TensorBuiltinEnv.make(task, 5, 17, prev_action=True, **options)
    assert env.observation_spec == numpy_env.observation_spec
    np.testing.assert_array_equal(env.reset(), numpy_env.reset())
    rng = np.random.default_rng(2)
    for i in range(300):
        actions = rng.integers(0, env.num_actions, 5)
        a, b = env.step(actions), numpy_env.step(actions)
        for name in ("obs", "reward", "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
            assert getattr(a, name).dtype == getattr(b, name).dtype
        for key in ("final_obs", "episode_return", "episode_length"):
            np.testing.assert_array_equal(a.info[key], b.info[key])
        if i == 150:  # reset without a seed continues the streams' episodes
            np.testing.assert_array_equal(env.reset(), numpy_env.reset())
    np.testing.assert_array_equal(env.reset(seed=4), numpy_env.reset(seed=4))


@pytest.mark.parametrize(("task", "options"), [CASES[5], CASES[8], CASES[10]])
def test_checkpoints_cross_between_numpy_and_tensor_envs(task, options):
    numpy_env = make(f"builtin/{task}", 4, 9, **options)
    env = TensorBuiltinEnv.make(task, 4, 9, **options)
    rng = np.random.default_rng(3)
    env.reset(), numpy_env.reset()
    for _ in range(23):
        actions = rng.integers(0, env.num_actions, 4)
        env.step(actions), numpy_env.step(actions)
    saved, numpy_saved = env.get_state(), numpy_env.get_state()
    assert saved.keys() == numpy_saved.keys()
    for key, value in numpy_saved.items():
        if key == "stats":
            for name, stat in value.items():
                np.testing.assert_array_equal(saved[key][name], stat)
                assert saved[key][name].dtype == stat.dtype
        else:
            np.testing.assert_array_equal(saved[key], value)
            assert saved[key].dtype == value.dtype, key
    # numpy checkpoint into a tensor env and back, through pickle
    resumed = TensorBuiltinEnv.make(task, 4, 0, **options)
    resumed.set_state(pickle.loads(pickle.dumps(numpy_saved)))
    other = make(f"builtin/{task}", 4, 0, **options)
    other.set_state(pickle.loads(pickle.dumps(saved)))
    for _ in range(200):
        actions = rng.integers(0, env.num_actions, 4)
        results = [e.step(actions) for e in (env, numpy_env, resumed, other)]
        for res in results[1:]:
            np.testing.assert_array_equal(res.obs, results[0].obs)
            np.testing.assert_array_equal(res.reward, results[0].reward)
            np.testing.assert_array_equal(
                res.info["episode_return"], results[0].info["episode_return"]
            )


def test_options_are_checked_as_the_numpy_env_checks_them():
    with pytest.raises(ConfigError, match="length"):
        tensor_params("memory-chain", length=1)
    with pytest.raises(ConfigError, match="k must be"):
        tensor_params("k-memory-chain", k=9, length=9)
    with pytest.raises(ConfigError, match="unknown options"):
        tensor_params("delayed-cue", length=3)
    with pytest.raises(ConfigError, match="decorrelate"):
        TensorBuiltinEnv.make("memory-chain", 2).decorrelate(5, 0)
    assert tensor_params("memory-chain").length == MemoryChain(1).length


@pytest.mark.parametrize(
    ("task", "options"),
    [CASES[1], *(pytest.param(*CASES[i], marks=pytest.mark.slow) for i in (2, 5, 8, 10))],
)
def test_compiled_step_equals_numpy_env(task, options):
    """Compiled (inductor's C++), the same bits: among others the chains' time to live, a
    float64 division by the length (7: no power of two, where a multiply by the reciprocal
    would round differently)."""
    params = tensor_params(task, True, **options)
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    calls = 0

    def compiled_once(*args):  # compiled at the first call, never again
        nonlocal calls
        calls += 1
        with torch._dynamo.config.patch(error_on_recompile=calls > 1):
            return compiled(*args)

    seeds = [5, 6, 7, 8]
    env = numpy_agent_envs(task, options, seeds, prev_action=True)
    state, obs = agent_reset(params, seeds)
    assert_steps_equal(env, params, state, obs, 300, np.random.default_rng(4), compiled_once)


def test_dtypes_hold_under_a_float64_default():
    params = tensor_params("watermaze", True, size=3, episode_steps=4, last_action=True)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        state, obs = agent_reset(params, [1, 2])
        out = step(params, state, torch.tensor([0, 3]))
    finally:
        torch.set_default_dtype(default)
    assert obs.dtype == out.obs.dtype == out.final_obs.dtype == out.reward.dtype == torch.float32
    assert out.episode_return.dtype == out.state.returns.dtype == torch.float64
    assert out.state.task.last_reward.dtype == torch.float32
    assert out.episode_length.dtype == out.state.t.dtype == torch.int64


@pytest.mark.parametrize("prev_action", [True, False])
def test_the_streaming_runtime_learns_the_same_on_the_adapter(monkeypatch, prev_action):
    """The adapter in place of the runtime's numpy envs: K agents' weights after 150 steps
    (episodes of 4: many auto-resets) are the same bits, and so are the env checkpoints."""
    from r2ac.rl.presets import preset
    from r2ac.rl.stream import runtime as stream
    from r2ac.rl.stream.runtime import StreamRuntime

    cfg = preset("stream").updated(
        env="builtin/memory-chain", env_options=("length=4",), hidden_size=8,
        stream_mlp=(8,), progress=False, eval_at_end=False, num_agents=3, seed=2,
        prev_action=prev_action,
    )  # fmt: skip

    def tensor_agent_envs(cfg, seeds):
        task = cfg.env.id.removeprefix("builtin/")
        return TensorBuiltinEnv.for_agents(task, seeds, cfg.model.prev_action, **cfg.env_kwargs())

    class Counter:
        update = 0

        def record(self, *a, **k):
            self.update += 1

    runs = []
    for make_envs in (stream.make_agent_envs, tensor_agent_envs):
        monkeypatch.setattr(stream, "make_agent_envs", make_envs)
        rt = StreamRuntime(cfg, dtype=torch.float64)
        for _ in range(150):
            rt.step(Counter())
        runs.append(rt)
    numpy_rt, tensor_rt = runs
    assert isinstance(tensor_rt.env, TensorBuiltinEnv)
    for name in ("theta_a", "theta_c"):
        assert torch.equal(getattr(numpy_rt.agent, name), getattr(tensor_rt.agent, name))
    saved, numpy_saved = tensor_rt.env.get_state(), numpy_rt.env.get_state()
    for key in ("seeds", "episode", "t"):
        np.testing.assert_array_equal(saved[key], numpy_saved[key])
    for rt in runs:
        rt.close()
