"""The counter hash's numpy and torch forms draw the same bits."""

from __future__ import annotations

import numpy as np
import torch

from r2ac.counter_hash import hashed_ints, hashed_ints_torch, uniforms, uniforms_torch

SEEDS = np.array([0, 1, 7, 2**40 + 3, 2**63 + 11, 2**64 - 1], dtype=np.uint64)


def _bits(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.uint64).view(np.int64).copy())


def test_uniforms_torch_equal_numpy_bit_for_bit():
    for step in (0, 1, 12345, 2**40):
        want = uniforms(SEEDS, step, 5)
        got = uniforms_torch(_bits(SEEDS), torch.tensor(step), 5)
        assert np.array_equal(got.numpy(), want)
        assert want.min() > 0 and want.max() < 1


def test_hashed_ints_torch_equal_numpy():
    rng = np.random.default_rng(0)
    episodes = rng.integers(0, 2**40, SEEDS.size)
    steps = rng.integers(0, 1000, SEEDS.size)
    for high in (2, 3, 32, 1000003, 2**31 - 1):
        want = hashed_ints(SEEDS, episodes, steps, purpose=5, high=high)
        got = hashed_ints_torch(
            _bits(SEEDS), torch.from_numpy(episodes), torch.from_numpy(steps), 5, high
        )
        assert np.array_equal(got.numpy(), want), high
    highs = rng.integers(1, 100, SEEDS.size)
    want = hashed_ints(SEEDS, episodes, steps, 2, highs)
    got = hashed_ints_torch(
        _bits(SEEDS),
        torch.from_numpy(episodes),
        torch.from_numpy(steps),
        2,
        torch.from_numpy(highs),
    )
    assert np.array_equal(got.numpy(), want)


def test_uniforms_spread():
    u = uniforms(np.arange(4000, dtype=np.uint64), 3, 2)
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.003
