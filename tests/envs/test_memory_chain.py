"""builtin/memory-chain and builtin/k-memory-chain: episode structure, rewards, options."""

import numpy as np
import pytest

from r2ac.envs import make, scripted
from r2ac.envs.builtin import MAX_CHAIN_LENGTH, KMemoryChain, MemoryChain
from r2ac.errors import ConfigError


def test_memory_chain_episode_structure_and_termination_at_length():
    length, b = 6, 8
    env = make("builtin/memory-chain", b, seed=0, length=length)
    assert env.observation_spec.shape == (3,) and env.num_actions == 2
    obs = env.reset()
    assert obs.dtype == np.float32 and obs.shape == (b, 3)
    np.testing.assert_array_equal(obs[:, 0], 1)  # time to live 1 - 0 / length
    np.testing.assert_array_equal(obs[:, 1], 0)
    assert set(np.unique(obs[:, 2])) == {-1.0, 1.0}  # the context, +1 / -1
    context = (obs[:, 2] > 0).astype(np.int64)
    for t in range(1, length):
        result = env.step(np.ones(b, np.int64))
        assert not (result.terminated | result.truncated).any() and not result.reward.any()
        np.testing.assert_allclose(result.obs[:, 0], 1 - t / length)
        np.testing.assert_array_equal(result.obs[:, 1], t == length - 1)  # query at the last
        np.testing.assert_array_equal(result.obs[:, 2], 0)  # the context is gone
    answers = np.where(np.arange(b) % 2 == 0, context, 1 - context)
    result = env.step(answers)
    np.testing.assert_array_equal(result.reward, np.where(np.arange(b) % 2 == 0, 1, -1))
    assert result.terminated.all() and not result.truncated.any()
    np.testing.assert_array_equal(result.info["episode_length"], length)
    np.testing.assert_array_equal(result.info["episode_return"], result.reward)
    np.testing.assert_array_equal(result.obs[:, 0], 1)  # already the next episode's first step
    assert np.abs(result.obs[:, 2]).min() == 1


def test_k_memory_chain_reward_timing():
    k, length, b = 3, 9, 16
    env = make("builtin/k-memory-chain", b, seed=1, k=k, length=length)
    obs = env.reset()
    shown = [obs[:, 2] > 0]
    for t in range(length):
        np.testing.assert_array_equal(obs[:, 1], t >= k)  # the query flag
        np.testing.assert_allclose(obs[:, 0], 1 - t / length)
        assert set(np.unique(obs[:, 2])) <= {-1.0, 1.0}  # a bit on every step
        # stream 0 answers right, stream 1 wrong, the others the current bit
        answer = shown[t].astype(np.int64)
        if t >= k:
            answer[0], answer[1] = shown[t - k][0], 1 - shown[t - k][1]
        result = env.step(answer)
        if t < k:
            np.testing.assert_array_equal(result.reward, 0)
        else:
            assert result.reward[0] == 1 and result.reward[1] == -1
            np.testing.assert_array_equal(result.reward, np.where(answer == shown[t - k], 1, -1))
        assert result.terminated.all() == (t == length - 1) and not result.truncated.any()
        obs = result.obs
        shown.append(obs[:, 2] > 0)
    assert result.info["episode_return"][0] == length - k
    assert result.info["episode_return"][1] == -(length - k)
    assert 0 < np.mean(shown[:length]) < 1


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("builtin/memory-chain", {"length": 2}),
        ("builtin/memory-chain", {"length": 40}),
        ("builtin/k-memory-chain", {"k": 1, "length": 8}),
        ("builtin/k-memory-chain", {"k": 5, "length": 40}),
    ],
)
def test_oracle_scores_one_per_query_and_constant_policies_zero(name, options):
    env = make(name, 64, seed=0, **options)
    chain = isinstance(env, MemoryChain)
    queries = 1 if chain else env.length - env.k
    oracle = scripted.memory_chain_memory_policy if chain else scripted.k_memory_chain_memory_policy
    mean, se = scripted.evaluate(env, oracle(env), 3)
    assert (mean, se) == (queries, 0.0)
    for action in (0, 1):
        mean, se = scripted.evaluate(env, scripted.constant_policy(action), 16, seed=action + 2)
        assert abs(mean) < 4 * se + 0.02 * queries, (action, mean, se)


def test_same_seed_same_episodes_and_seeds_differ():
    def first_obs(seed):
        env = make("builtin/k-memory-chain", 4, seed=seed, k=2, length=6)
        obs = [env.reset()]
        obs += [env.step(np.zeros(4, np.int64)).obs for _ in range(20)]
        return np.stack(obs)

    np.testing.assert_array_equal(first_obs(5), first_obs(5))
    assert not np.array_equal(first_obs(5), first_obs(6))


@pytest.mark.parametrize(
    ("name", "options", "says"),
    [
        ("builtin/memory-chain", {"length": 1}, "length must be an integer in [2, 100000]"),
        ("builtin/memory-chain", {"length": MAX_CHAIN_LENGTH + 1}, "length must be"),
        ("builtin/memory-chain", {"length": 3.5}, "wrong type"),
        ("builtin/memory-chain", {"length": True}, "wrong type"),
        ("builtin/memory-chain", {"k": 3}, "unknown options ['k']"),
        ("builtin/k-memory-chain", {"k": 0}, "k must be an integer in [1, length - 1]"),
        ("builtin/k-memory-chain", {"k": 64}, "k must be"),  # default length 64
        ("builtin/k-memory-chain", {"k": 2, "length": 0}, "length must be"),
        ("builtin/k-memory-chain", {"k": "2"}, "wrong type"),
    ],
)
def test_bad_options_are_one_line_config_errors(name, options, says):
    with pytest.raises(ConfigError) as error:
        make(name, 2, 0, **options)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_defaults():
    assert MemoryChain(1).length == 32
    env = KMemoryChain(1)
    assert (env.k, env.length) == (8, 64)
