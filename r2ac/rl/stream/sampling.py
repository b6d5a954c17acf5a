"""Actions from a policy head's parameters and counter-hash uniforms (r2ac.counter_hash): agent
k's draws depend on its own seed and step only, so K agents together equal K runs alone and a
sampler's whole state is its step counter."""

from __future__ import annotations

import math

import torch

from r2ac.envs.spaces import ActionSpace


def sample_actions(space: ActionSpace, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Actions (K, *action_shape) from the head's params (K, P) and uniforms u (K, n)
    (n = sample_draws(space)), by inverse CDF; Box by Box-Muller."""
    if space.kind == "discrete":
        cdf = torch.softmax(params, -1).cumsum(-1)
        return (cdf < u[:, :1].to(cdf.dtype)).sum(-1).clamp(max=space.nvec[0] - 1)
    if space.kind == "multi_discrete":
        parts = params.split(list(space.nvec), -1)
        acts = [
            (torch.softmax(p, -1).cumsum(-1) < u[:, i : i + 1].to(p.dtype)).sum(-1).clamp(max=n - 1)
            for i, (p, n) in enumerate(zip(parts, space.nvec, strict=True))
        ]
        return torch.stack(acts, -1)
    if space.kind == "multi_binary":
        return (u[:, : space.dims].to(params.dtype) < torch.sigmoid(params)).long()
    d = space.dims
    mean, log_std = params.chunk(2, -1)
    u1, u2 = u[:, :d], u[:, d : 2 * d]
    normal = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return mean + torch.exp(log_std) * normal.to(mean.dtype)


def sample_draws(space: ActionSpace) -> int:
    return 2 * space.dims if space.kind == "box" else space.dims
