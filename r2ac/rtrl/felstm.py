"""feLSTM (A.5): the eLSTM with full recurrent matrices, trained by BPTT or segment-wise SnAp-1.

    f(t) = sigmoid(F x(t) + W_f cp(t) + b_f)        W_f, W_z: (N, N) instead of w_f, w_z (N,)
    z(t) = tanh   (Z x(t) + W_z cp(t) + b_z)        cp(t) = keep(t) c(t-1)
    c(t) = f(t) cp(t) + (1 - f(t)) z(t)
    h(t) = sigmoid(O x(t) + W_o c(t) + b_o) c(t)

Exact RTRL would need d c_k / d theta for every k and theta (O(N^3) state), so rule "snap1"
uses SnAp-1 (Menick et al. 2021): only d c_i / d theta for the parameters of row i
([F | W_f]_i, [Z | W_z]_i, b_f_i, b_z_i), propagated with the diagonal of d c(t) / d c(t-1),

    a(t)  = keep(t) (f + fh diag(W_f) + zh diag(W_z))     fh, zh as in the eLSTM
    Ah(t) = a(t)[:, None] Ah(t-1) + outer(fh(t), [x(t); cp(t)])      Ah = d c / d [F | W_f], (N, D + N)

and Bh (the z side) likewise: N (2 (D + N) + 2) numbers per stream, O(N (D + N)) per step.

We implement the *segment-wise* variant, "SnAp-1 across segment boundaries": inside a segment
the gradient is exact BPTT (through the full W_f, W_z); only the carried part, the history
term d_hat(t0) . S(t0) with d_hat(t0) = dL_seg / dc(t0), uses the SnAp-1 sensitivities S(t0).
The carry over the segment is the eLSTM's one-GEMM unrolling with the diagonal a(t). With
T = 1 segments it differs from the paper's per-step SnAp-1 only in that d_hat(t0) applies the
last step's Jacobian exactly (full, not its diagonal). When W_f and W_z are diagonal the
recurrent Jacobian is diagonal, the dropped sensitivities are exactly zero, and the rule is
exact RTRL (tested). For dense W_f, W_z it is an approximation (cosine in docs/rules/snap1.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.rtrl.core import RecurrentCore, StateTensor
from r2ac.rtrl.elstm.math import carry_factors
from r2ac.rtrl.state import keep_mask

RULES = ("bptt", "snap1")


class FeLSTMSensitivity(NamedTuple):
    """SnAp-1 sensitivities: d c_i / d theta for the parameters of row i only."""

    M: Tensor  # (B, 2, N, D + N): [0] d c_i / d [F | W_f]_ij, [1] d c_i / d [Z | W_z]_ij
    b: Tensor  # (B, 2, N): d c_i / d (b_f, b_z)_i


class FeLSTMState(NamedTuple):
    c: Tensor  # (B, N)
    sens: FeLSTMSensitivity | None  # None for rule "bptt"


# ----------------------------------------------------------------------------- pure math


def local_derivatives(
    f: Tensor, z: Tensor, cp: Tensor, keep: Tensor | None, W_f: Tensor, W_z: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """fh, zh (d c / d pre_f, d c / d pre_z) and the diagonal a of d c(t) / d c(t-1); all (T, B, N)."""
    one_minus_f = 1.0 - f
    fh = (cp - z) * f * one_minus_f
    zh = one_minus_f * (1.0 - z * z)
    a = f + torch.diagonal(W_f) * fh + torch.diagonal(W_z) * zh
    if keep is not None:
        a = a * keep
    return fh, zh, a


def carry_segment(
    sens: FeLSTMSensitivity, fh: Tensor, zh: Tensor, a: Tensor, x: Tensor, cp: Tensor
) -> FeLSTMSensitivity:
    """SnAp-1 sensitivities at the segment end, unrolled as one batched GEMM (as for the eLSTM).

    S(t0+T) = G S(t0) + sum_tau outer(g(tau) [fh; zh](tau), [x; cp](tau)), g, G products of a.
    """
    T, B, N = fh.shape
    g, G = carry_factors(a)  # (T, B, N), (B, N)
    u = torch.stack([g * fh, g * zh], 2)  # (T, B, 2, N)
    inp = torch.cat([x, cp], -1).transpose(0, 1)  # (B, T, D + N)
    M = torch.bmm(u.view(T, B, 2 * N).permute(1, 2, 0), inp).view(B, 2, N, -1)
    M.addcmul_(sens.M, G[:, None, :, None])
    b = torch.addcmul(u.sum(0), sens.b, G[:, None, :])
    return FeLSTMSensitivity(M, b)


def inject_gradients(d_hat: Tensor, sens: FeLSTMSensitivity) -> tuple[Tensor, Tensor]:
    """d_hat (B, N) contracted with the sensitivities: dL/d[F | W_f; Z | W_z] (2, N, D + N), d(b_f, b_z) (2, N)."""
    B, _, N, DN = sens.M.shape
    rows = sens.M.permute(1, 2, 0, 3).reshape(2 * N, B, DN)  # a strided view, no copy
    weights = d_hat.t().repeat(2, 1).unsqueeze(1)  # (2N, 1, B)
    dM = torch.bmm(weights, rows).view(2, N, DN)  # one batched GEMV per row
    return dM, torch.einsum("bn,bkn->kn", d_hat, sens.b)


class _HistoryGradient(torch.autograd.Function):
    """Identity on c(t0); its backward adds d_hat(t0) . S(t0) (SnAp-1) to the parameters."""

    @staticmethod
    def forward(ctx, c0, M, b, F, Z, W_f, W_z, b_f, b_z):
        ctx.save_for_backward(M, b)
        ctx.D = F.shape[1]
        return c0.clone()

    @staticmethod
    def backward(ctx, d_hat):
        M, b = ctx.saved_tensors
        D = ctx.D
        dM, db = inject_gradients(d_hat, FeLSTMSensitivity(M, b))
        return (
            None,
            None,
            None,
            dM[0, :, :D],
            dM[1, :, :D],
            dM[0, :, D:],
            dM[1, :, D:],
            db[0],
            db[1],
        )


# ----------------------------------------------------------------------------- the layer


class FeLSTM(RecurrentCore):
    """feLSTM layer; rules "bptt" (truncated at segment starts) and "snap1" (see module doc).

    Parameter names as the eLSTM's, with W_f, W_z (N, N) for w_f, w_z. Initialisation as the
    eLSTM's; W_f, W_z ~ U(+-1/sqrt(N)).
    """

    RULES = RULES
    State = FeLSTMState

    @property
    def exact_gradient(self) -> bool:
        return self.rule != "snap1"  # SnAp-1 drops the off-diagonal sensitivities of W_f, W_z

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "snap1",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(input_size, hidden_size, rule)
        N, D = hidden_size, input_size
        kw = {"device": device, "dtype": dtype}
        self.F = nn.Parameter(torch.empty(N, D, **kw))
        self.Z = nn.Parameter(torch.empty(N, D, **kw))
        self.O = nn.Parameter(torch.empty(N, D, **kw))
        self.W_o = nn.Parameter(torch.empty(N, N, **kw))
        self.W_f = nn.Parameter(torch.empty(N, N, **kw))
        self.W_z = nn.Parameter(torch.empty(N, N, **kw))
        self.b_f = nn.Parameter(torch.empty(N, **kw))
        self.b_z = nn.Parameter(torch.empty(N, **kw))
        self.b_o = nn.Parameter(torch.empty(N, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        in_bound, rec_bound = 1.0 / math.sqrt(self.input_size), 1.0 / math.sqrt(self.hidden_size)
        for m in (self.F, self.Z, self.O):
            m.uniform_(-in_bound, in_bound)
        for m in (self.W_o, self.W_f, self.W_z):
            m.uniform_(-rec_bound, rec_bound)
        self.b_f.fill_(1.0)
        self.b_z.zero_()
        self.b_o.zero_()

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> FeLSTMState:
        with_sens = self.wants_sensitivities(batch_size, with_sensitivities)
        N, D = self.hidden_size, self.input_size
        kw = {"device": self.F.device, "dtype": self.F.dtype}
        c = torch.zeros(batch_size, N, **kw)
        if not with_sens:
            return FeLSTMState(c, None)
        sens = FeLSTMSensitivity(
            torch.zeros(batch_size, 2, N, D + N, **kw), torch.zeros(batch_size, 2, N, **kw)
        )
        return FeLSTMState(c, sens)

    def state_tensors(self, state: FeLSTMState, batch_size: int) -> list[StateTensor]:
        B, N, D = batch_size, self.hidden_size, self.input_size
        out = [("c", state.c, (B, N))]
        if state.sens is not None:
            out += [("sens.M", state.sens.M, (B, 2, N, D + N)), ("sens.b", state.sens.b, (B, 2, N))]
        return out

    def forward(
        self, x: Tensor, state: FeLSTMState, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, FeLSTMState]:
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        sens = state.sens
        tracks_history = self.tracks_history(state)
        N = self.hidden_size
        keep = keep_mask(reset, x.dtype)  # (T, B, 1) or None
        c = state.c.detach()
        if tracks_history:
            c = _HistoryGradient.apply(
                c, sens.M, sens.b, self.F, self.Z, self.W_f, self.W_z, self.b_f, self.b_z
            )
        pre = torch.nn.functional.linear(
            x, torch.cat([self.F, self.Z, self.O]), torch.cat([self.b_f, self.b_z, self.b_o])
        )  # (T, B, 3N)
        W_fz = torch.cat([self.W_f, self.W_z]).t()  # (N, 2N)
        cs, cps, fs, zs = [], [], [], []
        for t in range(T):
            cp = c if keep is None else c * keep[t]
            gates = torch.addmm(pre[t, :, : 2 * N], cp, W_fz)  # (B, 2N)
            f, z = torch.sigmoid(gates[:, :N]), torch.tanh(gates[:, N:])
            c = z + f * (cp - z)
            cs.append(c)
            cps.append(cp)
            fs.append(f)
            zs.append(z)
        c_all = torch.stack(cs)  # (T, B, N)
        o = torch.sigmoid(pre[..., 2 * N :] + c_all @ self.W_o.t())
        h = o * c_all

        new_sens = None
        if self.carries_sensitivities and sens is not None:
            with torch.no_grad():
                cp_all = torch.stack(cps).detach()
                fh, zh, a = local_derivatives(
                    torch.stack(fs).detach(),
                    torch.stack(zs).detach(),
                    cp_all,
                    keep,
                    self.W_f,
                    self.W_z,
                )
                new_sens = carry_segment(sens, fh, zh, a, x.detach(), cp_all)
        return h, FeLSTMState(c_all[-1].detach(), new_sens)
