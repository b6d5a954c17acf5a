"""V-trace targets and policy-gradient advantages (Espeholt et al. 2018, Sec. 4.1).

Pure tensor functions, time-major: every per-step tensor is ``(T, B)``. Step ``t`` means:
the agent sees ``x_t``, acts ``a_t``, receives ``r_t``; ``discounts[t]`` is the discount
applied to the value of ``x_{t+1}`` (0 where the episode ended at step ``t``).
Equations and conventions: ``docs/rules/vtrace.md``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # (T, B) V-trace value targets v_s
    pg_advantages: torch.Tensor  # (T, B) rho_s^pg (r_s + gamma_s v_{s+1} - V(x_s))


def discounts_from(
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Per-step discounts ``gamma * (1 - (terminated | truncated))``, shape ``(T, B)``.

    Both episode ends cut the bootstrap: with same-step auto-reset, ``x_{t+1}`` after an end
    at step ``t`` is the first observation of a new episode, so ``V(x_{t+1})`` must not be
    used. For termination this is exact. For truncation (a time limit) it treats the time-out
    as a terminal state: the target at that step is ``r_t`` instead of
    ``r_t + gamma V(x_final)``, biased towards 0 near the limit. To remove the bias, add
    the missing term with :func:`bootstrap_truncation`.
    """
    if terminated.shape != truncated.shape or terminated.dim() != 2:
        raise ValueError(
            f"terminated and truncated must both be (T, B); got {tuple(terminated.shape)} "
            f"and {tuple(truncated.shape)}"
        )
    ended = terminated.bool() | truncated.bool()  # (T, B)
    return gamma * (~ended).to(dtype or torch.get_default_dtype())


def bootstrap_truncation(
    rewards: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """Rewards with ``gamma * V(x_final)`` added at truncation steps, shape ``(T, B)``.

    Used together with :func:`discounts_from` (discount 0 at the truncation step), this gives
    the exact one-step bootstrap ``r_t + gamma V(x_final)`` through the time limit.
    ``final_values[t, b]`` is the value of the episode's true last observation (from the
    env's final observation); it is read only where ``truncated`` is set and is detached.
    Passing the values of the truncation step itself (``V(x_t)``) is a cheaper proxy when the
    env does not return the final observation. ``rewards`` should already be clipped: the
    bootstrap term is not a reward and is not clipped.
    """
    if not rewards.shape == truncated.shape == final_values.shape or rewards.dim() != 2:
        raise ValueError(
            "rewards, truncated and final_values must all be (T, B); got "
            f"{tuple(rewards.shape)}, {tuple(truncated.shape)}, {tuple(final_values.shape)}"
        )
    bonus = gamma * final_values.detach()  # (T, B)
    return rewards + torch.where(truncated.bool(), bonus, torch.zeros_like(bonus))


def _check_shapes(log_rhos, discounts, rewards, values, bootstrap_value) -> None:
    if values.dim() != 2:
        raise ValueError(f"values must be (T, B); got shape {tuple(values.shape)}")
    for name, tensor in (("log_rhos", log_rhos), ("discounts", discounts), ("rewards", rewards)):
        if tensor.shape != values.shape:
            raise ValueError(
                f"{name} must have the shape of values {tuple(values.shape)} (T, B); "
                f"got {tuple(tensor.shape)}"
            )
    if bootstrap_value.shape != values.shape[1:]:
        raise ValueError(
            f"bootstrap_value must be (B,) = {tuple(values.shape[1:])}; "
            f"got {tuple(bootstrap_value.shape)}"
        )


def _clipped(rhos: torch.Tensor, threshold: float | None) -> torch.Tensor:
    return rhos if threshold is None else torch.clamp(rhos, max=threshold)


@torch.no_grad()
def vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace targets ``vs`` and policy-gradient advantages, both ``(T, B)``.

    ``log_rhos`` = log pi(a_t|x_t) - log mu(a_t|x_t); ``discounts`` = gamma_t (0 at episode
    ends, see :func:`discounts_from`); ``values`` = V(x_t); ``bootstrap_value`` = V(x_T),
    shape ``(B,)``. A threshold of None means no clipping. Computed under ``no_grad``: no
    gradient flows through the outputs, they are constant targets for the losses.
    """
    _check_shapes(log_rhos, discounts, rewards, values, bootstrap_value)
    rhos = torch.exp(log_rhos)  # (T, B)
    clipped_rhos = _clipped(rhos, clip_rho_threshold)  # (T, B)
    cs = _clipped(rhos, clip_c_threshold)  # (T, B)

    v_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)  # (T, B) V(x_{t+1})
    deltas = clipped_rhos * (rewards + discounts * v_tp1 - values)  # (T, B)

    # v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})), with v_T - V(x_T) = 0.
    vs_minus_v = torch.empty_like(values)  # (T, B)
    acc = torch.zeros_like(bootstrap_value)  # (B,)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values  # (T, B)

    vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)  # (T, B) v_{s+1}
    pg_rhos = _clipped(rhos, clip_pg_rho_threshold)  # (T, B)
    pg_advantages = pg_rhos * (rewards + discounts * vs_tp1 - values)  # (T, B)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)
