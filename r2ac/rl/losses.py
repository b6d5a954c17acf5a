"""IMPALA actor-critic losses as pure functions of time-major ``(T, B)`` tensors.

Convention (IMPALA / torchbeast): every term is a **sum** over time and batch, not a mean,
so the gradient scale grows with ``T * B`` and the paper's learning rate (6e-4 with
batch 32) is tuned for that. The coefficients multiply these sums::

    loss = pg_loss + baseline_cost * 0.5 * sum (vs - V)^2 + entropy_cost * sum_t sum_a pi log pi

With the default ``baseline_cost = 0.5`` the squared error is weighted by 0.25 in total.
See ``docs/rules/vtrace.md``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BASELINE_COST = 0.5
ENTROPY_COST = 0.01


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"expected equal shapes (T, B); got {shapes}")


def _check_logits(logits: torch.Tensor, actions: torch.Tensor) -> None:
    if logits.dim() != actions.dim() + 1 or logits.shape[:-1] != actions.shape:
        raise ValueError(
            f"logits must be actions' shape + (A,); got logits {tuple(logits.shape)}, "
            f"actions {tuple(actions.shape)}"
        )


def action_log_probs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a_t | x_t) of the taken actions: logits ``(T, B, A)``, actions ``(T, B)``."""
    _check_logits(logits, actions)
    log_pi = F.log_softmax(logits, dim=-1)  # (T, B, A)
    return log_pi.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)  # (T, B)


def policy_gradient_loss(
    logits: torch.Tensor, actions: torch.Tensor, pg_advantages: torch.Tensor
) -> torch.Tensor:
    """``sum_{t,b} -log pi(a_t|x_t) * advantage_t``; the advantages are treated as constants."""
    _check_same_shape(actions=actions, pg_advantages=pg_advantages)
    log_pi_a = action_log_probs(logits, actions)  # (T, B)
    return -(log_pi_a * pg_advantages.detach()).sum()


def baseline_loss(values: torch.Tensor, vs: torch.Tensor) -> torch.Tensor:
    """``0.5 * sum_{t,b} (vs_t - V(x_t))^2``, without the baseline cost; ``vs`` is constant."""
    _check_same_shape(values=values, vs=vs)
    return 0.5 * ((vs.detach() - values) ** 2).sum()


def entropy_loss(logits: torch.Tensor) -> torch.Tensor:
    """Negative entropy summed over time and batch: ``sum_{t,b} sum_a pi log pi`` (<= 0)."""
    log_pi = F.log_softmax(logits, dim=-1)  # (T, B, A)
    return (log_pi.exp() * log_pi).sum()


def compute_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    values: torch.Tensor,
    vs: torch.Tensor,
    pg_advantages: torch.Tensor,
    baseline_cost: float = BASELINE_COST,
    entropy_cost: float = ENTROPY_COST,
) -> dict[str, torch.Tensor]:
    """Total IMPALA loss and its parts, all 0-dim tensors.

    Shapes: logits ``(T, B, A)``, actions/values/vs/pg_advantages ``(T, B)``. ``"loss"`` is the
    only entry with a graph (call ``.backward()`` on it); the parts are detached and already
    multiplied by their costs, so ``loss = pg_loss + baseline_loss + entropy_loss``.
    ``"entropy"`` is the mean per-step policy entropy, for logging.
    """
    _check_same_shape(actions=actions, values=values, vs=vs, pg_advantages=pg_advantages)
    _check_logits(logits, actions)
    pg = policy_gradient_loss(logits, actions, pg_advantages)
    baseline = baseline_cost * baseline_loss(values, vs)
    neg_entropy = entropy_loss(logits)
    entropy = entropy_cost * neg_entropy
    loss = pg + baseline + entropy
    return {
        "loss": loss,
        "pg_loss": pg.detach(),
        "baseline_loss": baseline.detach(),
        "entropy_loss": entropy.detach(),
        "entropy": -neg_entropy.detach() / actions.numel(),
    }
