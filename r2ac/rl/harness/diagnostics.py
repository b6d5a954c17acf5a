"""Diagnostics of a trained agent: where its gradient comes from, and what its critic knows.

Two questions that the training curves cannot answer (docs/rl.md, "Diagnosing a run"):

- How much of an RTRL gradient is the history term? With exact RTRL the gradient of a
  segment is the in-segment part (what TBPTT over the segment computes) plus the history
  part, the carried sensitivities contracted with dL/dc(t0). Zeroing the segment's start
  sensitivities (`without_history`) leaves exactly the in-segment part, so two backward
  passes split the gradient (`gradient_split`), per parameter group and per loss term.
- Does the critic track the return? `monte_carlo_returns` gives each step's discounted
  return where its episode ends inside the window, to set beside the critic's values, and
  `steps_to_end` bins them by the distance to the episode's end (a critic that cannot count
  the steps of a fixed-length episode is wrong by a constant there).

Used by `r2ac diagnose` (r2ac/rl/harness/diagnose_cli.py) on a run's checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from r2ac.rl.learning.actor import Segment
from r2ac.rl.learning.learner import Learner

# Gradient terms of the IMPALA loss, each the gradient of the loss with these costs zeroed:
# policy = (baseline 0, entropy 0), critic = (entropy 0) - policy, entropy = all - (entropy 0).
LOSS_TERMS = ("policy", "critic", "entropy")


def without_history(state: Any) -> Any:
    """`state` with zero RTRL sensitivities (a state without them is returned as is)."""
    sens = getattr(state, "sens", None)
    if sens is None:
        return state
    return state._replace(sens=pytree.tree_map(torch.zeros_like, sens))


def parameter_groups(agent: torch.nn.Module) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Trainable parameters by module: "stem", "heads", and the core's by parameter name
    ("core.F", "core.b_z", ...), the unit at which RTRL carries sensitivities."""
    groups: dict[str, list[tuple[str, torch.nn.Parameter]]] = {}
    for name, p in agent.named_parameters():
        if not p.requires_grad:
            continue
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] == "core" else parts[0]
        groups.setdefault(key, []).append((name, p))
    return groups


def _flat_grads(agent: torch.nn.Module, learner: Learner, seg: Segment) -> torch.Tensor:
    """The gradient of `learner`'s loss on `seg` as one vector over the agent's trainable
    parameters (zeros where a parameter gets none)."""
    params = [p for p in agent.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    learner.backward(seg)
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]
    )


def gradient_split(learner: Learner, seg: Segment) -> dict[str, dict[str, torch.Tensor]]:
    """Norms of the gradient of one batch, split three ways.

    Returns ``{term: {group: tensor([full, in_segment, history])}}`` for every loss term of
    `LOSS_TERMS` and ``"all"``, every parameter group of `parameter_groups` and ``"total"``;
    ``history = full - in_segment`` as vectors, then normed. Overwrites the agent's
    ``.grad``; the weights are not changed.
    """
    agent, cfg = learner.agent, learner.cfg
    costs = {
        "all": {},
        "no_entropy": {"entropy_cost": 0.0},
        "policy": {"entropy_cost": 0.0, "baseline_cost": 0.0},
    }
    flat = {}
    for key, changes in costs.items():
        term_learner = learner if not changes else _with_costs(learner, cfg, changes)
        flat[key] = torch.stack(
            [
                _flat_grads(agent, term_learner, seg),
                _flat_grads(agent, term_learner, seg._replace(state=without_history(seg.state))),
            ]
        )  # (2, P): full, in-segment
    by_term = {
        "all": flat["all"],
        "policy": flat["policy"],
        "critic": flat["no_entropy"] - flat["policy"],
        "entropy": flat["all"] - flat["no_entropy"],
    }
    spans, start = {}, 0
    for group, members in parameter_groups(agent).items():
        size = sum(p.numel() for _, p in members)
        spans[group] = slice(start, start + size)
        start += size
    spans["total"] = slice(0, start)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for term, g in by_term.items():
        out[term] = {}
        for group, span in spans.items():
            full, inseg = g[0, span], g[1, span]
            out[term][group] = torch.stack([full.norm(), inseg.norm(), (full - inseg).norm()])
    return out


def _with_costs(learner: Learner, cfg, changes: dict) -> Learner:
    """A Learner on the same agent whose loss uses other costs (its optimiser is unused)."""
    return Learner(learner.agent, cfg.updated(**changes))


def monte_carlo_returns(
    rewards: torch.Tensor, terminated: torch.Tensor, discount: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted returns of consecutive steps ``(T, B)`` and where they are complete.

    ``G[t] = r[t] + discount * G[t+1]``, cut after a terminating step. A step's return is
    complete (``mask`` True) when its episode terminates inside the window; the others
    would need rewards after it.
    """
    if rewards.shape != terminated.shape or rewards.dim() != 2:
        raise ValueError(
            f"rewards and terminated must both be (T, B); got {tuple(rewards.shape)} "
            f"and {tuple(terminated.shape)}"
        )
    returns = torch.zeros_like(rewards)
    complete = torch.zeros_like(terminated, dtype=torch.bool)
    g = torch.zeros_like(rewards[0])
    done = torch.zeros_like(terminated[0], dtype=torch.bool)
    for t in reversed(range(rewards.shape[0])):
        ends = terminated[t].bool()
        g = rewards[t] + discount * g * (~ends).to(rewards.dtype)
        done = done | ends
        returns[t], complete[t] = g, done
    return returns, complete


def steps_to_end(terminated: torch.Tensor) -> torch.Tensor:
    """For each step ``(T, B)``: how many steps after it its episode terminates (0 at the
    terminating step), or -1 where it does not terminate inside the window."""
    T = terminated.shape[0]
    out = torch.full(terminated.shape, -1, dtype=torch.int64)
    nxt = torch.full(terminated.shape[1:], -1, dtype=torch.int64)  # next end at or after t
    for t in reversed(range(T)):
        nxt = torch.where(terminated[t].bool(), torch.full_like(nxt, t), nxt)
        out[t] = torch.where(nxt >= 0, nxt - t, nxt)
    return out
