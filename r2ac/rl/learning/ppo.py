"""Several passes over a batch: stream minibatches, GAE, and the PPO-clip losses.

Pure functions of time-major ``(T, B)`` tensors; the learner (r2ac/rl/learning/learner.py) drives
them. A minibatch is a subset of the batch's STREAMS (whole segments), so every pass re-runs
the core over whole segments from their stored start states: with an RTRL core that start
state carries the sensitivities, and each pass's gradient is the full-history one of the
weights of that pass (docs/rules/passes.md says what is exact and what is stale).

PPO's losses are means over the minibatch's steps (IMPALA's, in losses.py, are sums).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.rl.learning.actor import Segment
from r2ac.rl.learning.losses import action_log_probs
from r2ac.rl.model.distributions import distribution
from r2ac.rtrl.state import select_streams


class BatchTargets(NamedTuple):
    """What a PPO update fixes once per batch, before its passes; every field ``(M, B)``."""

    advantages: torch.Tensor  # A_t (GAE or V-trace's pg advantages), not yet normalised
    returns: torch.Tensor  # value targets R_t
    old_values: torch.Tensor  # V_old(x_t) of the pre-pass forward (for value clipping)
    behaviour_log_pi: torch.Tensor  # log mu(a_t | x_t), the acting policy's

    def select(self, index: slice | torch.Tensor) -> BatchTargets:
        return BatchTargets(*(t[:, index] for t in self))


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) advantages and returns ``(T, B)`` (Schulman et al. 2016).

    ``discounts[t]`` = gamma (0 where the episode ended at step t, as for V-trace),
    ``values`` V(x_t) ``(T, B)``, ``bootstrap_value`` V(x_T) ``(B,)``. Returns = A + V.
    """
    if rewards.shape != values.shape or discounts.shape != values.shape:
        raise ValueError(f"rewards, discounts, values must be (T, B) = {tuple(values.shape)}")
    v_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)  # (T, B)
    deltas = rewards + discounts * v_tp1 - values  # (T, B)
    advantages = torch.empty_like(values)  # (T, B)
    acc = torch.zeros_like(bootstrap_value)  # (B,)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * lam * acc
        advantages[t] = acc
    return advantages, advantages + values


def stream_minibatches(num_streams: int, k: int, generator: torch.Generator | None) -> list[slice]:
    """`k` contiguous blocks of streams that cover the batch, in a fresh random order (PPO's
    shuffle of minibatches; deterministic for the generator's state).

    Blocks, not a fresh random partition per pass: a block is a view, so a minibatch's start
    state (with an RTRL core, its sensitivities: 2 B N D floats) is never copied. The streams
    of a batch are exchangeable (independent envs under one policy), so a random partition
    would add only that copy, 10 ms of a 116 ms update at the popgym preset (docs/rules/passes.md).
    """
    if num_streams % k:
        raise ValueError(f"{num_streams} streams do not split into {k} minibatches")
    size = num_streams // k
    order = torch.randperm(k, generator=generator).tolist()
    return [slice(i * size, (i + 1) * size) for i in order]


def select_segment(seg: Segment, index: slice | torch.Tensor) -> Segment:
    """The segment of the streams `index` (dim 1 of the tensors, dim 0 of the start state):
    views for a slice, a copy for an index tensor. The learner's passes only read it
    (they unroll with carry=False)."""
    tensors = [t[:, index] for t in seg[:-1]]
    return Segment(*tensors, select_streams(seg.state, index))


def standardise(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps) over every element (a batch or minibatch of advantages)."""
    return (x - x.mean()) / (x.std(unbiased=False) + eps)


def clipped_policy_loss(
    log_pi: torch.Tensor, old_log_pi: torch.Tensor, advantages: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip: mean of -min(r A, clip(r, 1-c, 1+c) A), r = pi / mu; all ``(T, B)``.
    Returns the loss and the fraction of steps whose ratio was clipped (a diagnostic)."""
    ratio = torch.exp(log_pi - old_log_pi.detach())  # (T, B)
    adv = advantages.detach()
    surrogate = torch.min(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    clipped = ((ratio - 1.0).abs() > clip).to(ratio.dtype).mean()
    return -surrogate.mean(), clipped.detach()


def value_loss(
    values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, clip: float
) -> torch.Tensor:
    """0.5 mean (V - R)^2; with `clip` > 0 the larger of that and the error of V_old +
    clip(V - V_old, -c, c) (PPO's value clipping). Tensors ``(T, B)``, R and V_old constant."""
    returns, old_values = returns.detach(), old_values.detach()
    error = (values - returns) ** 2  # (T, B)
    if clip > 0:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        error = torch.max(error, (clipped - returns) ** 2)
    return 0.5 * error.mean()


def ppo_losses(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    targets: BatchTargets,
    clip_coef: float,
    value_clip: float,
    baseline_cost: float,
    entropy_cost: float,
    value_scale: float | torch.Tensor = 1.0,
    space: ActionSpace | None = None,
    keep_graph: bool = False,
) -> dict[str, torch.Tensor]:
    """PPO's losses of one minibatch: logits ``(M, B, P)`` (the distribution of `space`;
    None: Discrete), actions ``(M, B, *S)``, values ``(M, B)``.

    The advantages are standardised over the minibatch; `value_scale` (PopArt's sigma)
    divides values, returns and old values, so the critic learns normalised returns.
    ``loss = policy + baseline_cost * value + entropy_cost * (-entropy)``, all means.
    The terms come detached (for logging) unless `keep_graph` (to differentiate one alone).
    """
    log_pi = action_log_probs(logits, actions, space)  # (M, B)
    advantages = standardise(targets.advantages)
    policy, clipped = clipped_policy_loss(log_pi, targets.behaviour_log_pi, advantages, clip_coef)
    scaled = [v / value_scale for v in (values, targets.returns, targets.old_values)]
    baseline = baseline_cost * value_loss(*scaled, clip=value_clip)
    neg_entropy = -distribution(space, logits).entropy().mean()
    entropy = entropy_cost * neg_entropy
    term = (lambda x: x) if keep_graph else torch.Tensor.detach
    return {
        "loss": policy + baseline + entropy,
        "pg_loss": term(policy),
        "baseline_loss": term(baseline),
        "entropy_loss": term(entropy),
        "entropy": -neg_entropy.detach(),
        "clip_fraction": clipped,
    }
