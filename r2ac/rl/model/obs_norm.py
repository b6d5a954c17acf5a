"""Running observation normalisation (`--obs-norm`), as Sample Factory's `normalize_input`.

Each feature of a flat float observation is standardised by the running mean and variance of
the observations the learner has trained on, ``(x - mean) / sqrt(var + eps)``, clipped to
+-clip. The statistics are buffers (they travel with the weights to the actors, the
evaluation and the checkpoints) and move once per batch, count-weighted (Chan et al.'s
parallel merge, r2ac/rl/running_stats.py), so they settle within the first batches and then move slowly.
"""

from __future__ import annotations

import torch
from torch import nn

from r2ac.rl.running_stats import merge_moments_


class RunningObsNorm(nn.Module):
    """Standardises observations ``(..., size)`` by running statistics kept as buffers."""

    def __init__(self, size: int, clip: float = 5.0, eps: float = 1e-5):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("var", torch.ones(size))
        self.register_buffer("count", torch.tensor(1e-4))  # the prior (0, 1) weighs ~nothing

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(self.mean.dtype)
        return ((x - self.mean) / (self.var + self.eps).sqrt()).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Merge the moments of `obs` ``(..., size)`` (every leading index one sample)."""
        x = obs.reshape(-1, self.mean.shape[0]).to(self.mean.dtype)  # (n, size)
        merge_moments_(self.count, self.mean, self.var, x)
