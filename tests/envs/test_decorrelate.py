"""--decorrelate-steps: each stream's first episode cut at a random 1..K steps (truncated), so
that episodes of one fixed length stop keeping every stream in step."""

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.envs.base import BatchedEnv, FirstEpisodeCut
from r2ac.errors import ConfigError

from .env_helpers import assert_resumes_bit_exactly

DELAY = 10  # delayed cue: every episode lasts DELAY + 2 steps
LENGTH = DELAY + 2


def episode_ends(env, steps: int, seed: int = 0) -> list[list[tuple[int, bool]]]:
    """Per stream, (step, truncated) of every episode end in `steps` random steps."""
    rng = np.random.default_rng(seed)
    env.reset(seed=3)
    ends = [[] for _ in range(env.num_envs)]
    for t in range(steps):
        result = env.step(rng.integers(0, env.num_actions, env.num_envs))
        for b in np.flatnonzero(result.terminated | result.truncated):
            ends[b].append((t + 1, bool(result.truncated[b])))
            assert result.info["episode_length"][b] == (
                t + 1 if len(ends[b]) == 1 else t + 1 - ends[b][-2][0]
            )
    return ends


def test_without_it_fixed_length_episodes_keep_every_stream_in_step():
    ends = episode_ends(make("builtin/delayed-cue", 16, seed=0, delay=DELAY), 5 * LENGTH)
    assert all(e == ends[0] for e in ends)
    assert [t for t, _ in ends[0]] == [LENGTH * k for k in range(1, 6)]


def test_first_episodes_are_cut_in_1_to_k_steps_then_run_whole():
    env = make("builtin/delayed-cue", 64, seed=0, delay=DELAY)
    env.decorrelate(LENGTH, seed=5)
    ends = episode_ends(env, 6 * LENGTH)
    firsts = []
    for stream in ends:
        (first, cut), *later = stream
        assert 1 <= first <= LENGTH
        assert cut == (first < LENGTH)  # a cut is a time limit; a whole first episode is not
        # every later episode runs its whole length, untouched
        assert [t for t, _ in later] == [first + LENGTH * k for k in range(1, len(later) + 1)]
        assert not any(truncated for _, truncated in later)
        firsts.append(first)
    # the phases spread over the episode (64 draws from 12 values: at least 8 distinct)
    assert len(set(firsts)) >= 8
    # the same seed draws the same cuts; another seed others
    again = make("builtin/delayed-cue", 64, seed=0, delay=DELAY)
    again.decorrelate(LENGTH, seed=5)
    assert episode_ends(again, 6 * LENGTH) == ends
    other = make("builtin/delayed-cue", 64, seed=0, delay=DELAY)
    other.decorrelate(LENGTH, seed=6)
    assert episode_ends(other, 6 * LENGTH) != ends


def test_every_reset_draws_new_cuts():
    cut = FirstEpisodeCut(32, 20, seed=0)
    cut.start()
    first = cut.left.copy()
    assert first.min() >= 1 and first.max() <= 20
    cut.start()
    assert not np.array_equal(cut.left, first)


def test_a_natural_end_before_the_cut_cancels_it():
    cut = FirstEpisodeCut(2, 5, seed=0)
    cut.left = np.array([3, 3])
    assert not cut(np.array([False, True])).any()  # stream 1 ended on its own
    assert not cut(np.array([False, False])).any()
    np.testing.assert_array_equal(cut(np.array([False, False])), [True, False])
    assert not cut(np.array([False, False])).any()  # never again


def test_state_resumes_bit_exactly_with_cuts_pending():
    env = make("builtin/delayed-cue", 8, seed=0, delay=DELAY)
    env.decorrelate(LENGTH, seed=1)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(4):
        env.step(rng.integers(0, env.num_actions, 8))
    assert (env.first_cut.left > 0).any()  # cuts still ahead
    fresh = make("builtin/delayed-cue", 8, seed=9, delay=DELAY)
    fresh.decorrelate(LENGTH, seed=2)
    actions = rng.integers(0, env.num_actions, (3 * LENGTH, 8))
    assert_resumes_bit_exactly(env, fresh, actions)


def test_gym_envs_cut_too():
    pytest.importorskip("popgym")
    env = make("gym/popgym-RepeatPreviousEasy-v0", 16, seed=0)
    env.decorrelate(20, seed=0)
    ends = episode_ends(env, 80)
    firsts = {stream[0][0] for stream in ends}
    assert max(firsts) <= 20 and len(firsts) >= 5
    assert all(stream[0][1] for stream in ends)  # all cut: RepeatPrevious lasts 51 steps


class _NoCut(BatchedEnv):
    """A backend that cannot end one stream's episode (as envpool's and DMLab's adapters)."""

    num_envs, num_actions = 2, 2

    def reset(self, seed=None):
        return np.zeros((2, 1), np.float32)

    def step(self, actions):
        raise AssertionError("not stepped")


def test_a_backend_that_cannot_cut_says_so_and_zero_is_off():
    with pytest.raises(ConfigError, match="_NoCut cannot end one stream's episode"):
        _NoCut().decorrelate(10, seed=0)
    env = _NoCut()
    env.decorrelate(0, seed=0)
    assert env.first_cut is None
    with pytest.raises(ConfigError, match="must be >= 1"):
        FirstEpisodeCut(2, 0, seed=0)


def test_the_actors_envs_are_cut_the_evaluations_are_not_and_runs_repeat():
    from r2ac.rl.config import validate
    from r2ac.rl.model.build import make_env
    from r2ac.rl.runtimes.serial import SerialRuntime
    from tests.rl.rl_helpers import tiny

    cfg = tiny(decorrelate_steps=5, batch_size=6)
    runtime = SerialRuntime(cfg)
    cuts = [actor.env.first_cut for actor in runtime.actors]
    assert len(cuts) == 2 and all(c is not None and c.max_steps == 5 for c in cuts)
    assert make_env(cfg, 3, 0).first_cut is None  # what the evaluation builds
    runtime.train()
    again = SerialRuntime(cfg)
    again.train()
    a, b = runtime.agent.state_dict(), again.agent.state_dict()
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    with pytest.raises(ConfigError, match="decorrelate_steps=-1"):
        validate(tiny(decorrelate_steps=-1))
