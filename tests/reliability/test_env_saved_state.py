"""Every built-in env checks its own saved state in set_state (issue 82, N4): a value out of
range (a memory-chain position t = 100 at length 32 never ends an episode again) is one
ConfigError naming the field, and the env is left as it was."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.errors import ConfigError
from r2ac.runs import checkpoint

from .conftest import r2ac_inline
from .test_malformed_inputs import one_line, snapshot

ENVS = [
    ("builtin/memory-chain", {"length": 32}),
    ("builtin/k-memory-chain", {"k": 4, "length": 16}),
    ("builtin/delayed-cue", {"delay": 5}),
    ("builtin/delayed-cue", {"delay": 5, "variant": "nonmatch", "num_cues": 3}),
    ("builtin/watermaze", {"size": 4, "episode_steps": 20}),
]


def stepped(name: str, options: dict, decorrelate: int = 0):
    env = make(name, 3, seed=1, **options)
    if decorrelate:
        env.decorrelate(decorrelate, seed=2)
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(7):
        env.step(rng.integers(0, env.num_actions, 3))
    return env


def refused(env, state: dict, field: str) -> str:
    """set_state(state) raises one line naming `field`; env's own state is unchanged."""
    before = copy.deepcopy(env.get_state())
    with pytest.raises(ConfigError) as error:
        env.set_state(state)
    message = str(error.value)
    head = "env state" + (f" {field}" if field else "") + ("" if field.endswith(".") else ":")
    assert message.startswith(head) and "\n" not in message, message
    after = env.get_state()
    for key, value in before.items():
        if isinstance(value, dict):
            for k, v in value.items():
                assert (
                    np.array_equal(np.asarray(v), np.asarray(after[key][k])) or v == after[key][k]
                )
        else:
            np.testing.assert_array_equal(value, after[key])
    return message


@pytest.mark.parametrize("t", [100, 32, -1000])
def test_memory_chain_position_past_the_episode_is_refused(t):
    """The finding: t = 100 (and -1000) at length 32 was accepted and no episode ended."""
    env = stepped("builtin/memory-chain", {"length": 32})
    state = env.get_state()
    state["t"] = np.array([t, 0, 0], dtype=np.int64)
    message = refused(env, state, "t")
    assert f"{t} at stream 0, expected 0..31" in message


@pytest.mark.parametrize(("name", "options"), ENVS)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("t", 10**6),
        ("t", -1),
        ("episode", -5),
        ("seeds", -1),
        ("seeds", 2**40),
        ("t", np.zeros(2, np.int64)),  # the wrong shape
        ("t", np.array([0.5, 0, 0])),  # the wrong dtype
        ("stats", {"returns": np.full(3, np.nan), "lengths": np.zeros(3, np.int64)}),
        ("stats", {"returns": np.zeros(3), "lengths": np.full(3, -3)}),
    ],
)
def test_counters_out_of_range_are_refused(name, options, field, value):
    env = stepped(name, options)
    state = env.get_state()
    state[field] = np.full(3, value) if np.ndim(value) == 0 else value
    target = field if field != "stats" else "stats."
    refused(env, state, target)


@pytest.mark.parametrize(
    ("name", "options", "field", "value"),
    [
        ("builtin/delayed-cue", {"delay": 5}, "cue", 2),
        ("builtin/delayed-cue", {"delay": 5}, "novel_slot", 2),
        ("builtin/delayed-cue", {"delay": 5, "num_cues": 3}, "other", -1),
        ("builtin/watermaze", {"size": 4}, "pos", 16),
        ("builtin/watermaze", {"size": 4}, "goal", -1),
    ],
)
def test_task_values_out_of_range_are_refused(name, options, field, value):
    env = stepped(name, options)
    state = env.get_state()
    state[field] = np.full(3, value)
    refused(env, state, field)


def test_inconsistent_task_values_are_refused():
    cue = stepped("builtin/delayed-cue", {"delay": 5, "num_cues": 3})
    state = cue.get_state()
    state["other"] = state["cue"].copy()
    refused(cue, state, "other")
    maze = stepped("builtin/watermaze", {"size": 4})
    state = maze.get_state()
    state["pos"] = state["goal"].copy()
    refused(maze, state, "pos")
    state = maze.get_state()
    state["last_reward"] = np.full(3, 7.0, np.float32)
    refused(maze, state, "last_reward")


def test_missing_fields_and_a_damaged_first_cut_are_refused():
    env = stepped("builtin/memory-chain", {"length": 32}, decorrelate=50)
    state = env.get_state()
    del state["episode"]
    refused(env, state, "episode")
    state = env.get_state()
    state["first_cut"]["left"] = np.full(3, 51)
    refused(env, state, "first_cut.left")
    state = env.get_state()
    state["first_cut"]["rng"] = {"bit_generator": "PCG64", "state": "garbage"}
    refused(env, state, "first_cut.rng")
    refused(env, [1, 2, 3], "")


@pytest.mark.parametrize(("name", "options"), ENVS)
def test_a_valid_state_still_resumes_bit_exactly(name, options):
    env = stepped(name, options, decorrelate=9)
    state = copy.deepcopy(env.get_state())
    twin = make(name, 3, seed=99, **options)
    twin.decorrelate(9, seed=3)
    twin.reset()
    twin.set_state(state)
    actions = np.random.default_rng(5).integers(0, env.num_actions, (20, 3))
    for a in actions:
        x, y = env.step(a), twin.step(a)
        np.testing.assert_array_equal(x.obs, y.obs)
        np.testing.assert_array_equal(x.reward, y.reward)


@pytest.mark.parametrize("t", [100, -1000])
def test_resume_with_an_env_position_out_of_range_is_one_line(t, run_copy, capsys):
    """The same through `r2ac train --resume` (a checkpoint with a valid digest): one line,
    nothing in the run directory changed."""
    path = run_copy / "checkpoints" / "latest.pt"
    payload = checkpoint.load(path)
    payload["actors"][0]["env"]["t"][0] = t
    checkpoint.save_atomic(payload, path)
    before = snapshot(run_copy)
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    one_line(code, lines, f"env state t: {t} at stream 0, expected 0..4")
    assert snapshot(run_copy) == before
