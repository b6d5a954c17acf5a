"""Running moments, updated in place: the one normaliser of the trainer.

`RunningStats` keeps per-row counts, means and sums of squared deviations as float64 numpy
arrays and adds one sample per row at a time (Welford): the streaming agents' observation
normalisers and reward scales (K rows, one per agent). `merge_moments_` adds a batch of samples
to one row's (count, mean, var) at once (Chan et al.'s parallel merge): the batched trainer's
observation normalisation (r2ac/rl/model/obs_norm.py). `welford_update` is the same update as
`RunningStats.update` written as a pure function of tensors (a reference for tests).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

OBS_EPS = 1e-8
REWARD_EPS = 1e-8


class Moments(NamedTuple):
    """count (K,), mean (K, ...), p (K, ...) (the sum of squared deviations)."""

    count: torch.Tensor
    mean: torch.Tensor
    p: torch.Tensor


def welford_update(m: Moments, x: torch.Tensor) -> Moments:
    """The moments with sample x (K, ...) added (a new Moments; nothing changes in place)."""
    count = m.count + 1.0
    diff = x - m.mean
    mean = m.mean + diff / count.view(-1, *([1] * (x.dim() - 1)))
    return Moments(count, mean, m.p + diff * (x - mean))


def moments_var(m: Moments) -> torch.Tensor:
    """p / (count - 1), 1 before two samples."""
    c = m.count.view(-1, *([1] * (m.mean.dim() - 1)))
    return torch.where(c >= 2, m.p / (c - 1).clamp(min=1.0), torch.ones_like(m.p))


class RunningStats:
    """Welford's running mean and variance per row, float64 numpy arrays updated in place (a
    few numpy ops on (K, ...) arrays: what a batch-1 step can afford); `moments()` gives them
    as tensors sharing the memory."""

    def __init__(self, k: int, shape=()):
        self.count, self.mean = np.zeros(k), np.zeros((k, *shape))
        self.p = np.zeros_like(self.mean)

    def _c(self) -> np.ndarray:
        return self.count.reshape(-1, *([1] * (self.mean.ndim - 1)))

    def update(self, x: np.ndarray) -> None:
        self.count += 1.0
        diff = x - self.mean
        self.mean += diff / self._c()
        self.p += diff * (x - self.mean)

    def var(self) -> np.ndarray:
        c = self._c()
        return np.where(c >= 2, self.p / np.maximum(c - 1, 1.0), 1.0)

    def normalise(self, x: np.ndarray) -> np.ndarray:
        """(x - mean) / sqrt(var + 1e-8), float64."""
        return (x - self.mean) / np.sqrt(self.var() + OBS_EPS)

    def moments(self) -> Moments:
        return Moments(*(torch.from_numpy(a) for a in (self.count, self.mean, self.p)))

    def load(self, saved) -> None:
        """Counts, means and p from `saved` (three tensors or arrays of these shapes)."""
        for a, t in zip((self.count, self.mean, self.p), saved, strict=True):
            a[...] = torch.as_tensor(t).numpy()


class RewardScale:
    """Reward scaling by the running std of the discounted return, per row: u <- gamma u + r,
    the stats take u, r / sqrt(var(u) + eps), u reset after an episode's end."""

    def __init__(self, k: int):
        self.stats, self.ret = RunningStats(k), np.zeros(k)

    def scale(self, reward, done: np.ndarray, discount: float) -> np.ndarray:
        """The scaled reward (K,) float64; the return and its stats move in place."""
        reward = np.asarray(reward, dtype=np.float64)
        ret = discount * self.ret + reward
        self.stats.update(ret)
        self.ret[...] = np.where(done, 0.0, ret)
        return reward / np.sqrt(self.stats.var() + REWARD_EPS)


def merge_moments_(count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, x: torch.Tensor):
    """Add the samples x (n, size) to one row's running (count (), mean (size,), var (size,)),
    in place, by Chan et al.'s parallel merge (population variance)."""
    n = x.shape[0]
    if n == 0:
        return
    batch_mean, batch_var = x.mean(0), x.var(0, unbiased=False)
    delta, total = batch_mean - mean, count + n
    m2 = var * count + batch_var * n + delta**2 * count * n / total
    mean += delta * n / total
    var.copy_(m2 / total)
    count.copy_(total)
