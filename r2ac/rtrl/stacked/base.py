"""What every stacked core shares: the states, the parameter drawing, the checks.

A stacked core holds no tensors: its parameters are a dict of (K, ...) tensors the caller
owns (agent k's weights are slice k of each), its state a NamedTuple of (K, ...) tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from r2ac.errors import ConfigError

# ----------------------------------------------------------------------------- states


class EmptyState(NamedTuple):
    """The memoryless core's state: nothing."""


class HiddenState(NamedTuple):
    """TBPTT(1) cores (`*-bptt`, `gru-bptt`): the previous state only, no sensitivities."""

    h: Tensor  # (K, 2, N/2) pairs for RTU, (K, 2, N) for LRU, (K, N) cell c for eLSTM, h for GRU, minGRU


class PairRTRLState(NamedTuple):
    """RTU / LRU under exact RTRL: the complex state in pairs and its sensitivities.

    The complex form s = s1 + i s2 per unit; d s / d W2 = i d s / d W1 (tied), so only the
    first input map's sensitivity is stored, as two planes (real, imaginary: contiguous rows
    for the carry's real ops); the small per-unit one as (re, im) in the last dimension.
    """

    h: Tensor  # (K, 2, U): (s1; s2) for U units (RTU: c1, c2; LRU: Re h, Im h)
    sens_W: Tensor  # (K, 2, U, D): d s_i / d W1[i, j] (RTU W1, LRU B_re), (Re; Im) planes
    sens_v: Tensor  # (K, M, U, 2): d s_i / d v_m[i] for the per-unit vectors, complex as (re, im)


class ELSTMRTRLState(NamedTuple):
    """eLSTM under exact RTRL: the cell state and its (diagonal) sensitivities."""

    c: Tensor  # (K, N)
    sens_FZ: Tensor  # (K, 2, N, D): d c_i / d F[i, j], d c_i / d Z[i, j]
    sens_wb: Tensor  # (K, 4, N): d c_i / d (w_f, w_z, b_f, b_z)[i]


class MinGRURTRLState(NamedTuple):
    """minGRU under exact RTRL: the state and its (diagonal) sensitivities."""

    h: Tensor  # (K, N)
    sens_W: Tensor  # (K, 2, N, D): d h_i / d W_z[i, j], d h_i / d W_h[i, j]
    sens_b: Tensor  # (K, 2, N): d h_i / d b_z[i], d h_i / d b_h[i]


# ----------------------------------------------------------------------------- helpers


def keep_factor(reset: Tensor, dtype: torch.dtype) -> Tensor:
    """1 where the agent's stream goes on, 0 where it restarts at this step: reset (K,) -> (K,)."""
    return (~reset).to(dtype)


def generators_for(generator, K: int) -> list[torch.Generator | None]:
    """K generators, one per agent: a list is taken as is (its length must be K); one
    generator (or None: torch's global one) draws every agent in turn from the same stream."""
    if isinstance(generator, (list, tuple)):
        if len(generator) != K:
            raise ConfigError(f"init_params: got {len(generator)} generators for {K} agents")
        return list(generator)
    return [generator] * K


def stack_agents(
    draw: Callable[[torch.Generator | None], dict[str, Tensor]],
    generator,
    K: int,
) -> dict[str, Tensor]:
    """Draw each agent's parameters from its own generator and stack them: name -> (K, ...)."""
    per_agent = [draw(g) for g in generators_for(generator, K)]
    return {name: torch.stack([p[name] for p in per_agent]) for name in per_agent[0]}


class StackedCore:
    """K agents' cores stepped together, each with its own weights (leading dim K everywhere).

    Subclasses set `name`, `rule` ("rtrl", "bptt" or "none") and implement `param_shapes`,
    `_draw` (one agent's parameters, in the existing module's order of draws), `initial_state`,
    `step`, `peek` and `sensitivity_numbers`.
    """

    name: str = ""
    rule: str = "none"

    def __init__(
        self, num_agents: int, input_size: int, hidden_size: int, dtype: torch.dtype, device=None
    ):
        self.num_agents, self.input_size, self.hidden_size = num_agents, input_size, hidden_size
        self.output_size = hidden_size
        self.dtype = dtype
        self.device = torch.device("cpu") if device is None else torch.device(device)

    # -- parameters
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> the shape of one agent's tensor (the existing module's parameter shape)."""
        raise NotImplementedError

    def _draw(self, generator: torch.Generator | None) -> dict[str, Tensor]:
        raise NotImplementedError

    def _empty(self, *shape: int) -> Tensor:
        return torch.empty(*shape, dtype=self.dtype, device=self.device)

    def init_params(self, generator=None) -> dict[str, Tensor]:
        """name -> (K, ...) plain tensors, initialised as the existing module initialises its own.

        `generator`: one torch.Generator (agents drawn one after another from it), or a list of
        K generators (agent k from its own: agent k with seed s + k gets the same weights alone
        or in lockstep), or None (torch's global generator). The caller sets requires_grad.
        """
        return stack_agents(self._draw, generator, self.num_agents)

    def check_params(self, params: dict[str, Tensor]) -> None:
        """ConfigError if `params` lacks a name or has a wrong shape (for loading checkpoints)."""
        K = self.num_agents
        for name, shape in self.param_shapes().items():
            if name not in params:
                raise ConfigError(f"{self.name}: parameter {name!r} missing")
            if tuple(params[name].shape) != (K, *shape):
                raise ConfigError(
                    f"{self.name}: parameter {name!r} has shape {tuple(params[name].shape)}, "
                    f"expected {(K, *shape)}"
                )

    def upper_bounds(self) -> dict[str, float]:
        """name -> the largest value its entries keep: the learner clamps them after each
        update (the module's `project_`). None by default; the RTU and LRU bound their phase."""
        return {}

    # -- state
    def initial_state(self) -> NamedTuple:
        raise NotImplementedError

    def _zeros(self, *shape: int) -> Tensor:
        return torch.zeros(*shape, dtype=self.dtype, device=self.device)

    def step(
        self, params: dict[str, Tensor], x: Tensor, state: NamedTuple, reset: Tensor
    ) -> tuple[Tensor, NamedTuple]:
        """h (K, output_size), differentiable w.r.t. params and x, and the next state (detached).

        x (K, D); reset (K,) bool: agent k's stream restarts at this step (its state and
        sensitivities are zeroed before the step).
        """
        raise NotImplementedError

    def peek(
        self, params: dict[str, Tensor], x: Tensor, state: NamedTuple, reset: Tensor
    ) -> Tensor:
        """The output step() would give (no grad, no sensitivity update): for V(s')."""
        raise NotImplementedError

    # -- the hand-written gradient (the streaming agent's path: no autograd graph)
    def forward_manual(
        self, params: dict[str, Tensor], x: Tensor, state: NamedTuple, reset: Tensor
    ) -> tuple[Tensor, NamedTuple, tuple]:
        """h (K, output_size), the next state and what `backward_manual` needs, without a
        graph. This default reruns `step` under autograd in the backward; the cores override
        both with closed forms."""
        with torch.no_grad():
            h, new_state = self.step(params, x, state, reset)
        return h, new_state, (params, x, state, reset)

    def backward_manual(self, saved: tuple, g_h: Tensor, grads: dict[str, Tensor]) -> Tensor:
        """Writes dL/dparams (the rule's gradient, as autograd of `step` gives it) into
        `grads` (name -> (K, ...) tensors) for dL/dh = g_h (K, output_size); returns dL/dx."""
        params, x, state, reset = saved
        with torch.enable_grad():
            leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
            x_leaf = x.detach().requires_grad_()
            h, _ = self.step(leaves, x_leaf, state, reset)
            got = torch.autograd.grad(h, [x_leaf, *leaves.values()], g_h, allow_unused=True)
        for name, g in zip(leaves, got[1:], strict=True):
            grads[name].zero_() if g is None else grads[name].copy_(g)
        return got[0]

    def peek_manual(
        self, params: dict[str, Tensor], x: Tensor, state: NamedTuple, saved: tuple, rows: slice
    ) -> Tensor:
        """peek() with no reset, from the weights of this step's `forward_manual` (its `saved`,
        rows `rows` of it matching `params`), unchanged since: a core may reuse what it
        computed of them."""
        return self.peek(params, x, state, torch.zeros(x.shape[0], dtype=torch.bool))

    def sensitivity_numbers(self) -> int:
        """Numbers of carried sensitivities per agent (0 without RTRL)."""
        return 0

    def state_numbers(self) -> int:
        """Numbers in one agent's state (hidden state + sensitivities)."""
        return sum(t[0].numel() for t in self.initial_state())

    def param_numbers(self) -> int:
        """Parameters per agent."""
        return sum(int(torch.Size(s).numel()) for s in self.param_shapes().values())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, num_agents={self.num_agents}, "
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, dtype={self.dtype})"
        )


def as_list(params: dict[str, Tensor], names: Sequence[str]) -> list[Tensor]:
    return [params[n] for n in names]
