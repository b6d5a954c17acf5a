"""IMPALA actor-critic losses as pure functions of time-major ``(T, B)`` tensors.

Convention (IMPALA / torchbeast): every term is a **sum** over time and batch, not a mean,
so the gradient scale grows with ``T * B`` and the paper's learning rate (6e-4 with
batch 32) is tuned for that. The coefficients multiply these sums::

    loss = pg_loss + baseline_cost * 0.5 * sum (vs - V)^2 + entropy_cost * sum_t sum_a pi log pi

With the default ``baseline_cost = 0.5`` the squared error is weighted by 0.25 in total.
See ``docs/rules/vtrace.md``.

``logits`` is the policy's distribution parameters ``(T, B, P)`` and ``actions`` are
``(T, B, *S)``; ``space`` (an `r2ac.envs.spaces.ActionSpace`; None: Discrete) picks the
distribution (r2ac/rl/model/distributions.py), so every loss takes log-probs, whatever the space.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from r2ac.envs.spaces import ActionSpace
from r2ac.rl.model.distributions import check_actions, distribution

BASELINE_COST = 0.5
ENTROPY_COST = 0.01


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"expected equal shapes (T, B); got {shapes}")


def action_log_probs(
    logits: torch.Tensor, actions: torch.Tensor, space: ActionSpace | None = None
) -> torch.Tensor:
    """log pi(a_t | x_t) of the taken actions: logits ``(T, B, P)``, actions ``(T, B, *S)``."""
    check_actions(space, logits, actions)
    return distribution(space, logits).log_prob(actions)  # (T, B)


def policy_gradient_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    pg_advantages: torch.Tensor,
    space: ActionSpace | None = None,
) -> torch.Tensor:
    """``sum_{t,b} -log pi(a_t|x_t) * advantage_t``; the advantages are treated as constants."""
    log_pi_a = action_log_probs(logits, actions, space)  # (T, B)
    _check_same_shape(log_pi_a=log_pi_a, pg_advantages=pg_advantages)
    return -(log_pi_a * pg_advantages.detach()).sum()


def baseline_loss(values: torch.Tensor, vs: torch.Tensor) -> torch.Tensor:
    """``0.5 * sum_{t,b} (vs_t - V(x_t))^2``, without the baseline cost; ``vs`` is constant."""
    _check_same_shape(values=values, vs=vs)
    return 0.5 * ((vs.detach() - values) ** 2).sum()


def entropy_loss(logits: torch.Tensor, space: ActionSpace | None = None) -> torch.Tensor:
    """Negative entropy summed over time and batch: ``sum_{t,b} sum_a pi log pi`` (<= 0
    for a categorical; a Gaussian's differential entropy may be either sign)."""
    if space is not None and space.kind != "discrete":
        return -distribution(space, logits).entropy().sum()
    log_pi = F.log_softmax(logits, dim=-1)  # (T, B, A); one sum, as always (same bits)
    return (log_pi.exp() * log_pi).sum()


def compute_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    values: torch.Tensor,
    vs: torch.Tensor,
    pg_advantages: torch.Tensor,
    baseline_cost: float = BASELINE_COST,
    entropy_cost: float = ENTROPY_COST,
    space: ActionSpace | None = None,
) -> dict[str, torch.Tensor]:
    """Total IMPALA loss and its parts, all 0-dim tensors.

    Shapes: logits ``(T, B, P)``, actions ``(T, B, *S)``, values/vs/pg_advantages ``(T, B)``. ``"loss"`` is the
    only entry with a graph (call ``.backward()`` on it); the parts are detached and already
    multiplied by their costs, so ``loss = pg_loss + baseline_loss + entropy_loss``.
    ``"entropy"`` is the mean per-step policy entropy, for logging.
    """
    _check_same_shape(values=values, vs=vs, pg_advantages=pg_advantages)
    check_actions(space, logits, actions)
    pg = policy_gradient_loss(logits, actions, pg_advantages, space)
    baseline = baseline_cost * baseline_loss(values, vs)
    neg_entropy = entropy_loss(logits, space)
    entropy = entropy_cost * neg_entropy
    loss = pg + baseline + entropy
    return {
        "loss": loss,
        "pg_loss": pg.detach(),
        "baseline_loss": baseline.detach(),
        "entropy_loss": entropy.detach(),
        "entropy": -neg_entropy.detach() / values.numel(),
    }
