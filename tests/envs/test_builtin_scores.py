"""The score table of docs/envs.md: random, best memoryless and scripted policies.

Fixed seeds; tolerances are about 4 standard errors of the measured means.
"""

import numpy as np
import pytest

from r2ac.envs import make, scripted
from r2ac.envs.builtin import DelayedCue, Watermaze

DEFAULT_DELAY = 64  # builtin/delayed-cue default: memory span delay + 1 = 65 steps
WATERMAZE_MEMORYLESS_BOUND = 2 * 200 / 64  # 2H/N: each search costs >= N/2 steps


def test_default_delayed_cue_needs_memory_over_50_steps():
    env = DelayedCue(1)
    assert env.delay == DEFAULT_DELAY and env.delay + 1 > 50
    assert env.episode_steps == DEFAULT_DELAY + 2


@pytest.mark.parametrize(("variant", "num_cues"), [("cue", 2), ("cue", 4), ("nonmatch", 4)])
def test_delayed_cue_scores(variant, num_cues):
    env = DelayedCue(128, seed=0, delay=DEFAULT_DELAY, num_cues=num_cues, variant=variant)
    chance = 2 / num_cues - 1 if variant == "cue" else 0.0  # random == best memoryless
    optimal, se = scripted.evaluate(env, scripted.delayed_cue_memory_policy(env), 4)
    assert optimal == 1.0 and se == 0.0
    for policy in (
        scripted.random_policy(env.num_actions, seed=1),
        scripted.delayed_cue_memoryless_policy(env),
    ):
        mean, se = scripted.evaluate(env, policy, 8, seed=2)
        assert abs(mean - chance) < 4 * max(se, 0.02), (mean, se)


def test_watermaze_scores():
    env = Watermaze(64, seed=0)
    assert (env.size, env.episode_steps) == (8, 200)
    measured = {
        "random": scripted.evaluate(env, scripted.random_policy(4, seed=1), 6, seed=1),
        "cycle": scripted.evaluate(env, scripted.watermaze_cycle_policy(env), 6, seed=1),
        "memory": scripted.evaluate(env, scripted.watermaze_memory_policy(env), 6, seed=1),
        "oracle": scripted.evaluate(env, scripted.watermaze_oracle_policy(env), 6, seed=1),
    }
    documented = {"random": 1.36, "cycle": 5.93, "memory": 33.0, "oracle": 38.0}
    for name, (mean, se) in measured.items():
        assert abs(mean - documented[name]) < 4 * se + 0.1, (name, mean, se)
    assert measured["cycle"][0] < WATERMAZE_MEMORYLESS_BOUND
    assert measured["memory"][0] > 5 * WATERMAZE_MEMORYLESS_BOUND


def test_random_memoryless_watermaze_policies_stay_below_the_bound():
    """Stochastic tables pi(action | position, last reward), biased to be far from uniform."""
    env = Watermaze(64, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(6):
        logits = 3.0 * rng.normal(size=(env.num_cells, 2, 4))
        probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
        cumulative = probs.cumsum(axis=-1)

        def act(obs, done, cumulative=cumulative):
            cell = scripted._decode_position(obs, env.size)
            rows = cumulative[cell, obs[:, -1].astype(np.int64)]  # (B, 4)
            return (rng.random((len(obs), 1)) > rows).sum(axis=1).clip(max=3)

        mean, se = scripted.evaluate(env, act, 2, seed=4)
        assert mean < WATERMAZE_MEMORYLESS_BOUND, mean


def test_cycle_visits_every_cell_once():
    moves = scripted.cycle_actions(8)
    cell, seen = 0, []
    for _ in range(64):
        seen.append(cell)
        row = np.clip(cell // 8 + scripted.MOVES[moves[cell], 0], 0, 7)
        col = np.clip(cell % 8 + scripted.MOVES[moves[cell], 1], 0, 7)
        cell = row * 8 + col
    assert sorted(seen) == list(range(64)) and cell == 0


@pytest.mark.parametrize("name", ["builtin/memory-chain", "builtin/k-memory-chain"])
def test_memory_chain_scores(name):
    """Defaults (length 32; k 8 over 64 steps): the memory policy answers every query
    (1 resp. 56 per episode); random and constant (best memoryless) score 0."""
    env = make(name, 128, seed=0)
    if name == "builtin/memory-chain":
        queries, memory = 1, scripted.memory_chain_memory_policy(env)
    else:
        queries, memory = 56, scripted.k_memory_chain_memory_policy(env)
    assert scripted.evaluate(env, memory, 4) == (queries, 0.0)
    for policy in (scripted.random_policy(2, seed=1), scripted.constant_policy(0)):
        mean, se = scripted.evaluate(env, policy, 8, seed=2)
        assert abs(mean) < 4 * max(se, 0.02 * queries**0.5), (mean, se)
