"""Shared checks of the env tests."""

from __future__ import annotations

import pickle

import numpy as np


def assert_resumes_bit_exactly(env, fresh, actions: np.ndarray) -> None:
    """Snapshot `env` (through pickle), restore it into `fresh` (another env of the same
    task), step both with `actions` (T, B): every step's obs, reward, flags and episode info
    must agree."""
    fresh.set_state(pickle.loads(pickle.dumps(env.get_state())))
    for a in actions:
        x, y = env.step(a), fresh.step(a)
        for name in ("obs", "reward", "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name))
        for key in ("episode_return", "episode_length"):
            np.testing.assert_array_equal(x.info[key], y.info[key])
