"""Stacked minGRU (r2ac.rtrl.mingru, the registry's form): one step, K agents' own weights.

Per agent and unit (element-wise), hp = keep h(t-1):

    z = sigmoid(W_z x + b_z),  c = g(W_h x + b_h),  h = (1 - z) hp + z c,  y = tanh(h)
    e_z = (c - hp) z (1 - z) = dh/dpre_z,   e_h = z g'(pre_h) = dh/dpre_h
    a   = keep (1 - z) = dh(t)/dh(t-1)   (diagonal)

Exact RTRL, one step (S: d h / d theta, its diagonal part):

    S_W(t) = a S_W(t-1) + e x^T   (K, 2, N, D): d h_i / d W_z[i, j], d h_i / d W_h[i, j]
    S_b(t) = a S_b(t-1) + e       (K, 2, N):    d h_i / d b_z[i], d h_i / d b_h[i]

and dL/dtheta = (dL/dh(t)) S(t) per unit. TBPTT(1) ("-bptt") keeps e x^T and e alone. dL/dx
is this step's W_z^T (g e_z) + W_h^T (g e_h) under both rules. `_MinGRURTRLStep` runs the step
and the carry in its forward (no graph) and that contraction in its backward; the tanh on top
is plain autograd. `forward_manual` / `backward_manual` are the same math without a graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from r2ac.rtrl.mingru import candidate, candidate_and_derivative, lecun_normal_
from r2ac.rtrl.stacked.base import HiddenState, MinGRURTRLState, StackedCore, keep_factor
from r2ac.rtrl.stacked.linear import linear

CANDIDATE = "g"  # the registry's form (the anchor's cell)


def joined(first: Tensor, second: Tensor) -> Tensor:
    """[first; second] along dim 1, (K, 2M, ...): a view where `second` follows `first` in
    each agent's memory (the streaming agent's layout, W_z before W_h, b_z before b_h), else
    a copy."""
    inner = first.shape[1:]
    strides = torch.empty(inner, device="meta").stride()
    if (
        first.shape == second.shape
        and first.stride()[1:] == second.stride()[1:] == strides
        and first.stride(0) == second.stride(0)
        and second.data_ptr() == first.data_ptr() + first[0].numel() * first.element_size()
    ):
        return first.as_strided((first.shape[0], 2 * inner[0], *inner[1:]), first.stride())
    return torch.cat([first, second], 1)


def pre_activations(params: dict[str, Tensor], x: Tensor) -> Tensor:
    """[W_z x + b_z; W_h x + b_h] (K, 2N), no graph."""
    W = joined(params["W_z"], params["W_h"])
    bias = joined(params["b_z"], params["b_h"]).unsqueeze(1)
    return torch.baddbmm(bias, x.unsqueeze(1), W.transpose(1, 2)).squeeze(1)


def gates(pre: Tensor, hp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """h (K, N), z and e = (e_z, e_h) (K, 2, N) from pre (K, 2N) and hp (K, N)."""
    N = hp.shape[1]
    z = torch.sigmoid(pre[:, :N])
    c, dc = candidate_and_derivative(pre[:, N:], CANDIDATE)
    diff = c - hp
    h = torch.addcmul(hp, z, diff)  # (1 - z) hp + z c
    return h, z, torch.stack([diff * z * (1.0 - z), z * dc], 1)


def carry(S_W: Tensor, S_b: Tensor, a: Tensor, e: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """S_W(t) = a S_W(t-1) + e x^T (K, 2, N, D), S_b(t) = a S_b(t-1) + e (K, 2, N)."""
    S_W = torch.mul(S_W, a[:, None, :, None]).addcmul_(e.unsqueeze(3), x[:, None, None, :])
    return S_W, torch.addcmul(e, a.unsqueeze(1), S_b)


def mingru_cell(params: dict[str, Tensor], x: Tensor, hp: Tensor) -> Tensor:
    """h(t) (K, N), differentiable w.r.t. params and x (the TBPTT(1) step; hp detached)."""
    z = torch.sigmoid(linear(params["W_z"], x, params["b_z"]))
    c = candidate(linear(params["W_h"], x, params["b_h"]), CANDIDATE)[0]
    return torch.addcmul(hp, z, c - hp)


class _MinGRURTRLStep(torch.autograd.Function):
    """h(t) with the exact RTRL gradient (module doc). Inputs x, W_z, W_h, b_z, b_h, h_prev,
    keep, S_W, S_b; outputs h (K, N) and the new S_W, S_b (non-differentiable)."""

    @staticmethod
    def forward(ctx, x, W_z, W_h, b_z, b_h, h_prev, keep, S_W, S_b):
        params = {"W_z": W_z, "W_h": W_h, "b_z": b_z, "b_h": b_h}
        hp = h_prev * keep.unsqueeze(1)
        h, z, e = gates(pre_activations(params, x), hp)
        S_W_new, S_b_new = carry(S_W, S_b, (1.0 - z) * keep.unsqueeze(1), e, x)
        ctx.save_for_backward(W_z, W_h, e, S_W_new, S_b_new)
        ctx.mark_non_differentiable(S_W_new, S_b_new)
        return h, S_W_new, S_b_new

    @staticmethod
    def backward(ctx, g, _g_W, _g_b):
        W_z, W_h, e, S_W, S_b = ctx.saved_tensors
        g_W = g[:, None, :, None] * S_W  # (K, 2, N, D)
        g_b = g.unsqueeze(1) * S_b  # (K, 2, N)
        g_x = None
        if ctx.needs_input_grad[0]:
            ge = e * g.unsqueeze(1)  # dL/d(pre_z, pre_h) of this step
            g_x = torch.bmm(ge.view(ge.shape[0], 1, -1), torch.cat([W_z, W_h], 1)).squeeze(1)
        return g_x, g_W[:, 0], g_W[:, 1], g_b[:, 0], g_b[:, 1], None, None, None, None


class StackedMinGRU(StackedCore):
    """The minGRU (r2ac.rtrl.mingru.MinGRU, g candidate, tanh output): W_z, W_h (K, N, D),
    b_z, b_h (K, N); output (K, N) = tanh(h)."""

    def __init__(self, name, rule, num_agents, input_size, hidden_size, dtype, device=None):
        super().__init__(num_agents, input_size, hidden_size, dtype, device)
        self.name, self.rule = name, rule

    def param_shapes(self):
        N, D = self.hidden_size, self.input_size
        return {"W_z": (N, D), "W_h": (N, D), "b_z": (N,), "b_h": (N,)}

    def _draw(self, generator):
        N, D = self.hidden_size, self.input_size
        out = {n: lecun_normal_(self._empty(N, D), generator) for n in ("W_z", "W_h")}
        return out | {"b_z": self._zeros(N), "b_h": self._zeros(N)}

    def initial_state(self):
        K, N, D = self.num_agents, self.hidden_size, self.input_size
        if self.rule == "bptt":
            return HiddenState(self._zeros(K, N))
        return MinGRURTRLState(self._zeros(K, N), self._zeros(K, 2, N, D), self._zeros(K, 2, N))

    def sensitivity_numbers(self) -> int:
        return 2 * self.hidden_size * (self.input_size + 1) if self.rule == "rtrl" else 0

    def step(self, params, x, state, reset):
        keep = keep_factor(reset, x.dtype)
        if self.rule == "bptt":
            h = mingru_cell(params, x, state.h.detach() * keep.unsqueeze(1))
            new_state = HiddenState(h.detach())
        else:
            names = ("W_z", "W_h", "b_z", "b_h")
            h, S_W, S_b = _MinGRURTRLStep.apply(
                x, *(params[n] for n in names), state.h, keep, state.sens_W, state.sens_b
            )
            new_state = MinGRURTRLState(h.detach(), S_W, S_b)
        return torch.tanh(h), new_state

    # -- the hand-written gradient (no graph): _MinGRURTRLStep's math plus the tanh

    @torch.no_grad()
    def forward_manual(self, params, x, state, reset):
        keep = keep_factor(reset, x.dtype).unsqueeze(1)  # (K, 1)
        hp = state.h * keep
        h, z, e = gates(pre_activations(params, x), hp)
        if self.rule == "rtrl":
            S_W, S_b = carry(state.sens_W, state.sens_b, (1.0 - z) * keep, e, x)
            new_state, sens = MinGRURTRLState(h, S_W, S_b), (S_W, S_b)
        else:
            new_state, sens = HiddenState(h), None
        y = torch.tanh(h)
        return y, new_state, (params, x, y, e, sens)

    def backward_manual(self, saved, g_h, grads):
        params, x, y, e, sens = saved
        g = torch.ops.aten.tanh_backward(g_h, y)  # dL/dh (K, N)
        ge = e * g.unsqueeze(1)  # (K, 2, N): this step's dL/dpre_z, dL/dpre_h
        if sens is None:  # TBPTT(1): this step's immediate terms only
            torch.mul(ge[:, 0].unsqueeze(2), x.unsqueeze(1), out=grads["W_z"])
            torch.mul(ge[:, 1].unsqueeze(2), x.unsqueeze(1), out=grads["W_h"])
            grads["b_z"].copy_(ge[:, 0])
            grads["b_h"].copy_(ge[:, 1])
        else:
            S_W, S_b = sens
            g_col = g.unsqueeze(2)
            torch.mul(S_W[:, 0], g_col, out=grads["W_z"])
            torch.mul(S_W[:, 1], g_col, out=grads["W_h"])
            torch.mul(S_b[:, 0], g, out=grads["b_z"])
            torch.mul(S_b[:, 1], g, out=grads["b_h"])
        W = joined(params["W_z"], params["W_h"])  # (K, 2N, D)
        return torch.bmm(ge.view(ge.shape[0], 1, -1), W).squeeze(1)

    @torch.no_grad()
    def peek(self, params, x, state, reset):
        hp = state.h * keep_factor(reset, x.dtype).unsqueeze(1)
        return torch.tanh(gates(pre_activations(params, x), hp)[0])
