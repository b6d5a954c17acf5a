"""Stacked eLSTM (r2ac.rtrl.elstm, the header of r2ac/rtrl/elstm/math.py): one step, K agents.

Per agent and unit (element-wise), cp = keep c(t-1):

    f = sigmoid(F x + b_f + w_f cp),  z = tanh(Z x + b_z + w_z cp),  c = f cp + (1 - f) z
    o = sigmoid(O x + b_o + W_o c),   h = o c
    fh = (cp - z) f (1 - f) = dc/dpre_f,   zh = (1 - f)(1 - z^2) = dc/dpre_z
    a  = keep (f + w_f fh + w_z zh) = dc(t)/dc(t-1)   (diagonal)

Exact RTRL, one step (S: d c / d theta for the recurrent parameters, their diagonal part):

    S_F(t) = a S_F(t-1) + fh x^T,   S_Z(t) = a S_Z(t-1) + zh x^T            (K, 2, N, D)
    S_(w_f, w_z, b_f, b_z)(t) = a S(t-1) + (fh cp, zh cp, fh, zh)          (K, 4, N)

and dL/dtheta = (dL/dc(t)) S(t) per unit. `_ELSTMRTRLStep` runs the step and the carry in its
forward (no graph) and that contraction in its backward (dL/dx: this step's F^T (g fh) +
Z^T (g zh)); the output gate (O, b_o, W_o, not recurrent) is plain autograd on top of c(t).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from r2ac.rtrl.stacked.base import ELSTMRTRLState, HiddenState, StackedCore, keep_factor
from r2ac.rtrl.stacked.linear import linear, matvec, vecmat

RECURRENT = ("F", "Z", "w_f", "w_z", "b_f", "b_z")


def elstm_cell(
    F: Tensor, Z: Tensor, w_f: Tensor, w_z: Tensor, b_f: Tensor, b_z: Tensor,
    x: Tensor, c_prev: Tensor, keep: Tensor, grad: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """c(t) (K, N) and f, z, cp; F, Z (K, N, D), vectors (K, N), x (K, D), c_prev (K, N).
    grad=False: no autograd-aware products (inside a Function's forward, or without grad)."""
    if grad:
        pre_f, pre_z = linear(F, x, b_f), linear(Z, x, b_z)
    else:
        pre_f, pre_z = matvec(F, x) + b_f, matvec(Z, x) + b_z
    cp = c_prev * keep.unsqueeze(1)
    f = torch.sigmoid(torch.addcmul(pre_f, w_f, cp))
    z = torch.tanh(torch.addcmul(pre_z, w_z, cp))
    return torch.addcmul(z, f, cp - z), f, z, cp


def elstm_output(
    O: Tensor, b_o: Tensor, W_o: Tensor, x: Tensor, c: Tensor, grad: bool = True
) -> Tensor:
    """h = sigmoid(O x + b_o + W_o c) * c: (K, N)."""
    if grad:
        return torch.sigmoid(linear(W_o, c, linear(O, x, b_o))) * c
    return torch.sigmoid(matvec(W_o, c) + matvec(O, x) + b_o) * c


class _ELSTMRTRLStep(torch.autograd.Function):
    """c(t) with the exact RTRL gradient (module doc). Inputs x, F, Z, w_f, w_z, b_f, b_z,
    c_prev, keep, S_FZ, S_wb; outputs c (K, N) and the new S_FZ, S_wb (non-differentiable)."""

    @staticmethod
    def forward(ctx, x, F, Z, w_f, w_z, b_f, b_z, c_prev, keep, S_FZ, S_wb):
        c, f, z, cp = elstm_cell(F, Z, w_f, w_z, b_f, b_z, x, c_prev, keep, grad=False)
        one_f = 1.0 - f
        fh = (cp - z) * f * one_f
        zh = one_f * (1.0 - z * z)
        a = (f + w_f * fh + w_z * zh) * keep.unsqueeze(1)  # (K, N)
        hz = torch.stack([fh, zh], 1)  # (K, 2, N)
        S_FZ_new = torch.addcmul(
            hz.unsqueeze(3) * x[:, None, None, :], a[:, None, :, None], S_FZ
        )  # (K, 2, N, D)
        S_wb_new = torch.addcmul(torch.cat([hz * cp.unsqueeze(1), hz], 1), a.unsqueeze(1), S_wb)
        ctx.save_for_backward(F, Z, hz, S_FZ_new, S_wb_new)
        ctx.mark_non_differentiable(S_FZ_new, S_wb_new)
        return c, S_FZ_new, S_wb_new

    @staticmethod
    def backward(ctx, g, _g_FZ, _g_wb):
        F, Z, hz, S_FZ, S_wb = ctx.saved_tensors
        g_FZ = g[:, None, :, None] * S_FZ  # (K, 2, N, D)
        g_wb = g.unsqueeze(1) * S_wb  # (K, 4, N)
        g_x = None
        if ctx.needs_input_grad[0]:
            gh = hz * g.unsqueeze(1)  # (K, 2, N): dL/dpre_f, dL/dpre_z
            g_x = torch.baddbmm(vecmat(gh[:, 0], F).unsqueeze(1), gh[:, 1:], Z).squeeze(1)
        g_F, g_Z = g_FZ.unbind(1)
        return (g_x, g_F, g_Z, *g_wb.unbind(1), None, None, None, None)


class StackedELSTM(StackedCore):
    """The eLSTM (r2ac.rtrl.elstm.ELSTM): parameters F, Z, O (K, N, D), W_o (K, N, N),
    w_f, w_z, b_f, b_z, b_o (K, N); output h (K, N)."""

    def __init__(self, name, rule, num_agents, input_size, hidden_size, dtype, device=None):
        super().__init__(num_agents, input_size, hidden_size, dtype, device)
        self.name, self.rule = name, rule

    def param_shapes(self):
        N, D = self.hidden_size, self.input_size
        shapes = {"F": (N, D), "Z": (N, D), "O": (N, D), "W_o": (N, N)}
        return shapes | {n: (N,) for n in ("w_f", "w_z", "b_f", "b_z", "b_o")}

    def _draw(self, generator):
        N, D = self.hidden_size, self.input_size
        in_b, rec_b = 1.0 / math.sqrt(D), 1.0 / math.sqrt(N)
        out = {n: self._empty(N, D).uniform_(-in_b, in_b, generator=generator) for n in "FZO"}
        out["W_o"] = self._empty(N, N).uniform_(-rec_b, rec_b, generator=generator)
        out["w_f"] = self._empty(N).normal_(0.0, 0.1, generator=generator)
        out["w_z"] = self._empty(N).normal_(0.0, 0.1, generator=generator)
        out["b_f"] = torch.ones(N, dtype=self.dtype, device=self.device)
        out["b_z"] = self._zeros(N)
        out["b_o"] = self._zeros(N)
        return out

    def initial_state(self):
        K, N, D = self.num_agents, self.hidden_size, self.input_size
        if self.rule == "bptt":
            return HiddenState(self._zeros(K, N))
        return ELSTMRTRLState(self._zeros(K, N), self._zeros(K, 2, N, D), self._zeros(K, 4, N))

    def sensitivity_numbers(self) -> int:
        return 2 * self.hidden_size * (self.input_size + 2) if self.rule == "rtrl" else 0

    def step(self, params, x, state, reset):
        keep = keep_factor(reset, x.dtype)
        rec = [params[n] for n in RECURRENT]
        if self.rule == "bptt":
            c = elstm_cell(*rec, x, state.h.detach(), keep)[0]
            new_state = HiddenState(c.detach())
        else:
            c, S_FZ, S_wb = _ELSTMRTRLStep.apply(x, *rec, state.c, keep, *state[1:])
            new_state = ELSTMRTRLState(c.detach(), S_FZ, S_wb)
        return elstm_output(params["O"], params["b_o"], params["W_o"], x, c), new_state

    # -- the hand-written gradient (no graph): _ELSTMRTRLStep's math plus the output gate

    @torch.no_grad()
    def forward_manual(self, params, x, state, reset):
        keep = keep_factor(reset, x.dtype).unsqueeze(1)  # (K, 1)
        c, f, z, cp = elstm_cell(*(params[n] for n in RECURRENT), x, state[0], keep[:, 0],
                                 grad=False)  # fmt: skip
        one_f = 1.0 - f
        fh = (cp - z) * f * one_f  # dc/dpre_f
        zh = one_f * (1.0 - z * z)  # dc/dpre_z
        hz = torch.stack([fh, zh], 1)  # (K, 2, N)
        if self.rule == "rtrl":
            a = (f + params["w_f"] * fh + params["w_z"] * zh) * keep  # dc(t)/dc(t-1), (K, N)
            S_FZ = torch.addcmul(hz.unsqueeze(3) * x[:, None, None, :], a[:, None, :, None],
                                 state.sens_FZ)  # (K, 2, N, D) # fmt: skip
            S_wb = torch.addcmul(torch.cat([hz * cp.unsqueeze(1), hz], 1), a.unsqueeze(1),
                                 state.sens_wb)  # (K, 4, N) # fmt: skip
            new_state, sens = ELSTMRTRLState(c, S_FZ, S_wb), (S_FZ, S_wb)
        else:
            new_state, sens = HiddenState(c), None
        pre_o = matvec(params["W_o"], c).add_(matvec(params["O"], x)).add_(params["b_o"])
        o = torch.sigmoid(pre_o)
        return o * c, new_state, (params, x, c, o, hz, cp, sens)

    def backward_manual(self, saved, g_h, grads):
        params, x, c, o, hz, cp, sens = saved
        g_o = torch.ops.aten.sigmoid_backward(g_h * c, o)  # dL/dpre_o (K, N)
        torch.mul(g_o.unsqueeze(2), x.unsqueeze(1), out=grads["O"])
        torch.mul(g_o.unsqueeze(2), c.unsqueeze(1), out=grads["W_o"])
        grads["b_o"].copy_(g_o)
        g_c = torch.addcmul(vecmat(g_o, params["W_o"]), g_h, o)  # dL/dc(t) (K, N)
        gh = hz * g_c.unsqueeze(1)  # (K, 2, N): this step's dL/dpre_f, dL/dpre_z
        if sens is None:  # TBPTT(1): this step's immediate terms only
            torch.mul(gh[:, 0].unsqueeze(2), x.unsqueeze(1), out=grads["F"])
            torch.mul(gh[:, 1].unsqueeze(2), x.unsqueeze(1), out=grads["Z"])
            torch.mul(gh[:, 0], cp, out=grads["w_f"])
            torch.mul(gh[:, 1], cp, out=grads["w_z"])
            grads["b_f"].copy_(gh[:, 0])
            grads["b_z"].copy_(gh[:, 1])
        else:
            S_FZ, S_wb = sens
            g_col = g_c.unsqueeze(2)
            torch.mul(g_col, S_FZ[:, 0], out=grads["F"])
            torch.mul(g_col, S_FZ[:, 1], out=grads["Z"])
            for m, name in enumerate(RECURRENT[2:]):
                torch.mul(g_c, S_wb[:, m], out=grads[name])
        g_x = torch.baddbmm(vecmat(gh[:, 0], params["F"]).unsqueeze(1), gh[:, 1:], params["Z"])
        return torch.baddbmm(g_x, g_o.unsqueeze(1), params["O"]).squeeze(1)

    @torch.no_grad()
    def peek(self, params, x, state, reset):
        rec = [params[n] for n in RECURRENT]
        c = elstm_cell(*rec, x, state[0], keep_factor(reset, x.dtype), grad=False)[0]
        return elstm_output(params["O"], params["b_o"], params["W_o"], x, c, grad=False)
