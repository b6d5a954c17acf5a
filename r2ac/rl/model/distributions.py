"""The policy head's output -> an action distribution, one interface for every action space.

`distribution(space, params)` takes the head's parameters ``(..., space.param_size)`` and
returns an object with

    log_prob(actions)  (...)                  actions (..., *space.action_shape)
    entropy()          (...)
    sample(generator)  (..., *action_shape)   draws from `generator` only
    mode()             (..., *action_shape)   the greedy action (the mean for a Gaussian)

Kinds (r2ac/envs/spaces.py): Discrete is a categorical over softmax(logits), computed as
r2ac always has (the same ops, so the same bits and the same samples for one generator);
MultiDiscrete is independent categoricals, log-probs and entropies summed; MultiBinary is
independent Bernoullis; Box is a diagonal Gaussian.

Box choices. The log-std is a state-independent parameter (`PolicyValueHeads.log_std`, one
per dimension, initialised to 0), appended to the means so that the params tensor, and the
segment's `behaviour_logits`, describe the whole distribution (cleanrl's and Sample
Factory's default). Actions are sampled unbounded and clipped to the bounds at the env side
(`r2ac.envs.spaces.box_to_env`), and the log-prob is that of the unclipped sample. Why not
tanh squashing: the Gaussian's log-prob and entropy are closed forms, exact in float64 and
the same at acting and learning; the squashed entropy has no closed form (it needs a sample
estimate), and the Jacobian term log(1 - tanh^2) loses precision near the bounds. The cost
is a bias when much mass lies beyond the bounds (the clipped actions all act alike), which
Pendulum-like tasks tolerate (as in cleanrl's PPO).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from r2ac.envs.spaces import ActionSpace

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class Categorical:
    """logits ``(..., A)``; actions ``(...)`` int64."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        log_pi = F.log_softmax(self.logits, dim=-1)  # (..., A)
        return log_pi.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)  # (...)

    def entropy(self) -> torch.Tensor:
        log_pi = F.log_softmax(self.logits, dim=-1)  # (..., A)
        return -(log_pi.exp() * log_pi).sum(-1)  # (...)

    def sample(self, generator: torch.Generator | None) -> torch.Tensor:
        probs = torch.softmax(self.logits, dim=-1)  # (..., A)
        if probs.dim() == 2:  # an actor's step (B, A): no reshapes on the hot path
            return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)
        flat = probs.reshape(-1, probs.shape[-1])  # (N, A)
        drawn = torch.multinomial(flat, 1, generator=generator).squeeze(1)  # (N,)
        return drawn.reshape(probs.shape[:-1])  # (...)

    def mode(self) -> torch.Tensor:
        return self.logits.argmax(-1)  # (...)


class MultiCategorical:
    """Independent categoricals: logits ``(..., sum n_k)``; actions ``(..., K)`` int64."""

    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...]):
        self.parts = [Categorical(x) for x in logits.split(list(nvec), dim=-1)]

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        terms = [d.log_prob(actions[..., k]) for k, d in enumerate(self.parts)]
        return torch.stack(terms, -1).sum(-1)  # (...)

    def entropy(self) -> torch.Tensor:
        return torch.stack([d.entropy() for d in self.parts], -1).sum(-1)  # (...)

    def sample(self, generator: torch.Generator | None) -> torch.Tensor:
        return torch.stack([d.sample(generator) for d in self.parts], -1)  # (..., K)

    def mode(self) -> torch.Tensor:
        return torch.stack([d.mode() for d in self.parts], -1)  # (..., K)


class Bernoullis:
    """Independent bits: logits ``(..., K)``; actions ``(..., K)`` int64 in {0, 1}."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        a = actions.to(self.logits.dtype)  # log p = a logsig(l) + (1 - a) logsig(-l)
        terms = a * F.logsigmoid(self.logits) + (1 - a) * F.logsigmoid(-self.logits)
        return terms.sum(-1)  # (...)

    def entropy(self) -> torch.Tensor:
        p = torch.sigmoid(self.logits)
        terms = p * F.logsigmoid(self.logits) + (1 - p) * F.logsigmoid(-self.logits)
        return -terms.sum(-1)  # (...)

    def sample(self, generator: torch.Generator | None) -> torch.Tensor:
        return torch.bernoulli(torch.sigmoid(self.logits), generator=generator).long()

    def mode(self) -> torch.Tensor:
        return (self.logits > 0).long()  # (..., K)


class DiagGaussian:
    """params ``(..., 2D)`` = means and log-stds; actions ``(..., D)`` float (unclipped)."""

    def __init__(self, params: torch.Tensor):
        self.mean, self.log_std = params.chunk(2, dim=-1)  # (..., D) each

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions.to(self.mean.dtype) - self.mean) * torch.exp(-self.log_std)  # (..., D)
        return (-0.5 * z * z - self.log_std - HALF_LOG_2PI).sum(-1)  # (...)

    def entropy(self) -> torch.Tensor:
        return (0.5 + HALF_LOG_2PI + self.log_std).sum(-1)  # (...)

    def sample(self, generator: torch.Generator | None) -> torch.Tensor:
        noise = torch.randn(
            self.mean.shape, generator=generator, dtype=self.mean.dtype, device=self.mean.device
        )
        return self.mean + torch.exp(self.log_std) * noise  # (..., D)

    def mode(self) -> torch.Tensor:
        return self.mean  # (..., D)


def distribution(space: ActionSpace | None, params: torch.Tensor):
    """The distribution of `space` (None: Discrete over the last dim) from ``(..., P)``."""
    if params.shape[-1] != (space.param_size if space else params.shape[-1]):
        raise ValueError(
            f"{space.describe()} needs {space.param_size} parameters per step; "
            f"got shape {tuple(params.shape)}"
        )
    kind = space.kind if space else "discrete"
    if kind == "discrete":
        return Categorical(params)
    if kind == "multi_discrete":
        return MultiCategorical(params, space.nvec)
    if kind == "multi_binary":
        return Bernoullis(params)
    return DiagGaussian(params)


def max_entropy(space: ActionSpace) -> float:
    """The largest entropy a policy over `space` can have (nats): the uniform policy's, ln n
    per categorical component summed (MultiBinary: ln 2 each); a Box's Gaussian has no
    largest, so inf."""
    if space.kind == "box":
        return math.inf
    return math.fsum(math.log(n) for n in space.nvec)


def check_actions(space: ActionSpace | None, params: torch.Tensor, actions: torch.Tensor) -> None:
    """ValueError unless actions are params' batch shape + the space's action shape."""
    shape = tuple(params.shape[:-1]) + (space.action_shape if space else ())
    if tuple(actions.shape) != shape:
        raise ValueError(
            f"logits must be the actions' (T, B) + (P,); got logits {tuple(params.shape)}, "
            f"actions {tuple(actions.shape)} (expected {shape})"
        )


def action_code(space: ActionSpace, actions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The previous-action input ``(..., space.code_size)``: one-hot per categorical (the
    discrete one clamped into range, as before), the bits of a MultiBinary, and clip(a, -1, 1)
    for a Box (the normalised action the env executed; unbounded dimensions pass raw)."""
    if space.kind == "discrete":
        n = space.nvec[0]
        return F.one_hot(actions.long().clamp(0, n - 1), n).to(dtype)
    if space.kind == "multi_discrete":
        codes = [
            F.one_hot(actions[..., k].long().clamp(0, n - 1), n) for k, n in enumerate(space.nvec)
        ]
        return torch.cat(codes, -1).to(dtype)  # (..., sum n_k)
    if space.kind == "multi_binary":
        return actions.to(dtype)  # (..., K)
    low, high = (torch.tensor(b, dtype=torch.float64) for b in (space.low, space.high))
    bounded = (low.isfinite() & high.isfinite()).to(actions.device)  # (D,)
    a = actions.to(dtype)
    return torch.where(bounded, a.clamp(-1.0, 1.0), a)  # (..., D)


def zero_where(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x ``(B, ...)`` with the rows where mask ``(B,)`` is set zeroed (a new episode)."""
    if x.dim() == mask.dim():  # Discrete actions (B,): the hot path of every actor step
        return x.masked_fill(mask, 0)
    return x.masked_fill(mask.view(mask.shape + (1,) * (x.dim() - mask.dim())), 0)


def action_dtype(space: ActionSpace, float_dtype: torch.dtype) -> torch.dtype:
    """The dtype of stored actions: int64, or the agent's float dtype for a Box."""
    return float_dtype if space.is_float else torch.int64
