"""Stacked GRU (TBPTT(1)) and the memoryless feedforward core, K agents' own weights.

GRU (r2ac.rtrl.gru, PyTorch's form), hp = keep h(t-1) detached:

    [r, z, n]_x = W_ih x + b_ih,  [r, z, n]_h = W_hh hp + b_hh
    r = sigmoid(r_x + r_h),  z = sigmoid(z_x + z_h),  n = tanh(n_x + r n_h)
    h = (1 - z) n + z hp

Feedforward (r2ac.rtrl.feedforward): h = relu(weight x + bias) (the module's nn.Linear).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from r2ac.rtrl.stacked.base import EmptyState, HiddenState, StackedCore, keep_factor
from r2ac.rtrl.stacked.linear import linear, matvec, vecmat


def gru_cell(params: dict[str, Tensor], x: Tensor, hp: Tensor, grad: bool = True) -> Tensor:
    """h(t) (K, N) from x (K, D) and the reset-masked previous h (K, N)."""
    N = hp.shape[1]
    if grad:
        gi = linear(params["W_ih"], x, params["b_ih"])
        gh = linear(params["W_hh"], hp, params["b_hh"])
    else:
        gi = matvec(params["W_ih"], x) + params["b_ih"]
        gh = matvec(params["W_hh"], hp) + params["b_hh"]
    rz = torch.sigmoid(gi[:, : 2 * N] + gh[:, : 2 * N])
    n = torch.tanh(torch.addcmul(gi[:, 2 * N :], rz[:, :N], gh[:, 2 * N :]))
    return torch.addcmul(n, rz[:, N:], hp - n)  # (1 - z) n + z hp


class StackedGRU(StackedCore):
    """GRU, TBPTT(1): W_ih (K, 3N, D), W_hh (K, 3N, N), b_ih, b_hh (K, 3N); output (K, N)."""

    def __init__(self, name, rule, num_agents, input_size, hidden_size, dtype, device=None):
        super().__init__(num_agents, input_size, hidden_size, dtype, device)
        self.name, self.rule = name, rule

    def param_shapes(self):
        N, D = self.hidden_size, self.input_size
        return {"W_ih": (3 * N, D), "W_hh": (3 * N, N), "b_ih": (3 * N,), "b_hh": (3 * N,)}

    def _draw(self, generator):
        bound = 1.0 / math.sqrt(self.hidden_size)  # nn.GRU's: every parameter U(+-1/sqrt(N))
        return {
            n: self._empty(*s).uniform_(-bound, bound, generator=generator)
            for n, s in self.param_shapes().items()
        }

    def initial_state(self):
        return HiddenState(self._zeros(self.num_agents, self.hidden_size))

    def step(self, params, x, state, reset):
        hp = state.h.detach() * keep_factor(reset, x.dtype).unsqueeze(1)
        h = gru_cell(params, x, hp)
        return h, HiddenState(h.detach())

    @torch.no_grad()
    def forward_manual(self, params, x, state, reset):
        N = self.hidden_size
        hp = state.h * keep_factor(reset, x.dtype).unsqueeze(1)
        gi = matvec(params["W_ih"], x).add_(params["b_ih"])  # (K, 3N)
        gh = matvec(params["W_hh"], hp).add_(params["b_hh"])
        rz = torch.sigmoid(gi[:, : 2 * N] + gh[:, : 2 * N])
        n = torch.tanh(torch.addcmul(gi[:, 2 * N :], rz[:, :N], gh[:, 2 * N :]))
        h = torch.addcmul(n, rz[:, N:], hp - n)
        return h, HiddenState(h), (params, x, hp, gh, rz, n)

    def backward_manual(self, saved, g_h, grads):
        params, x, hp, gh, rz, n = saved  # TBPTT(1): no gradient into hp
        N = self.hidden_size
        g_pre_n = torch.ops.aten.tanh_backward(g_h - g_h * rz[:, N:], n)  # (K, N)
        g_rz = torch.cat([g_pre_n * gh[:, 2 * N :], g_h * (hp - n)], 1)
        g_rz = torch.ops.aten.sigmoid_backward(g_rz, rz)  # dL/d(r, z) pre-activations (K, 2N)
        g_gi = torch.cat([g_rz, g_pre_n], 1)  # (K, 3N)
        g_gh = torch.cat([g_rz, g_pre_n * rz[:, :N]], 1)
        torch.mul(g_gi.unsqueeze(2), x.unsqueeze(1), out=grads["W_ih"])
        torch.mul(g_gh.unsqueeze(2), hp.unsqueeze(1), out=grads["W_hh"])
        grads["b_ih"].copy_(g_gi)
        grads["b_hh"].copy_(g_gh)
        return vecmat(g_gi, params["W_ih"])

    @torch.no_grad()
    def peek(self, params, x, state, reset):
        return gru_cell(params, x, state.h * keep_factor(reset, x.dtype).unsqueeze(1), grad=False)


class StackedFeedforward(StackedCore):
    """Memoryless: h = relu(weight x + bias), weight (K, N, D), bias (K, N) (the module's
    `linear.weight`, `linear.bias`); the state is empty and reset has nothing to reset."""

    def __init__(self, name, rule, num_agents, input_size, hidden_size, dtype, device=None):
        super().__init__(num_agents, input_size, hidden_size, dtype, device)
        self.name, self.rule = name, "none"

    def param_shapes(self):
        return {"weight": (self.hidden_size, self.input_size), "bias": (self.hidden_size,)}

    def _draw(self, generator):
        # nn.Linear's reset_parameters: kaiming_uniform_(a=sqrt(5)) = U(+-1/sqrt(D)), bias alike
        w = self._empty(self.hidden_size, self.input_size)
        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
        bound = 1.0 / math.sqrt(self.input_size)
        b = self._empty(self.hidden_size).uniform_(-bound, bound, generator=generator)
        return {"weight": w, "bias": b}

    def initial_state(self):
        return EmptyState()

    def state_numbers(self) -> int:
        return 0

    def step(self, params, x, state, reset):
        return torch.relu(linear(params["weight"], x, params["bias"])), state

    @torch.no_grad()
    def forward_manual(self, params, x, state, reset):
        h = torch.relu(matvec(params["weight"], x) + params["bias"])
        return h, state, (params, x, h)

    def backward_manual(self, saved, g_h, grads):
        params, x, h = saved
        g = torch.ops.aten.threshold_backward(g_h, h, 0.0)
        torch.mul(g.unsqueeze(2), x.unsqueeze(1), out=grads["weight"])
        grads["bias"].copy_(g)
        return vecmat(g, params["weight"])

    @torch.no_grad()
    def peek(self, params, x, state, reset):
        return torch.relu(matvec(params["weight"], x) + params["bias"])
