"""One-layer fast weight programmer (linear Transformer) with exact RTRL (A.2, Eq. 43-54).

    k, v, q = K x(t), V x(t), Q x(t)                 K, V, Q: (N, D), no activation on k
    W(t)    = keep(t) W(t-1) + outer(v(t), k(t))     fast weights, (N, N) per stream
    y(t)    = W(t) s(t),  s(t) = sigmoid(q(t))

RTRL sensitivities (per stream), restarted with W on a reset:

    Kh(t) = keep(t) Kh(t-1) + outer(v(t), x(t))      # Kh[a, j] = sum_tau v_a x_j, (N, D)
    Vh(t) = keep(t) Vh(t-1) + outer(k(t), x(t))      # Vh[b, j] = sum_tau k_b x_j, (N, D)

W(t) depends on K, V only through sum_tau v k^T, so with E = dL/dW(t):
dL/dK = E^T Kh,  dL/dV = E Vh. E(t) = outer(e(t), s(t)) (e = dL/dy) has rank one, so each
step's gradient is s (e^T Kh) and e (s^T Vh): O(N D), not O(N^2 D) (nor O(N^3)).

Segment form (what `loss.backward()` computes). Inside a segment t0+1 .. t0+T, with
m(t) = 1 if the stream has not restarted since t0, and mask(t, tau) = 1 if it has not
restarted in (tau, t],

    y(t) = m(t) W(t0) s(t) + sum_{tau <= t} mask(t, tau) v(tau) (k(tau) . s(t))

The second term is causal linear attention: plain autograd (BPTT inside the segment). The
first is `_HistoryReadout`, whose backward, besides d s, adds the history gradient through
W(t0) with the rank-one form: dK += sum_t m s(t) (e(t)^T Kh(t0)), dV += sum_t m e(t) (s(t)^T Vh(t0)).
The carry to the segment end is one GEMM each: W(t0+T) = m(T) W(t0) + sum mask(T, tau) v k^T, etc.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.rtrl.core import RecurrentCore, StateTensor

RULES = ("bptt", "rtrl")


class FWPSensitivity(NamedTuple):
    Kh: Tensor  # (B, N, D): sum_tau outer(v, x) since the last reset
    Vh: Tensor  # (B, N, D): sum_tau outer(k, x)


class FWPState(NamedTuple):
    W: Tensor  # (B, N, N) fast weights
    sens: FWPSensitivity | None  # None for rule "bptt"


# ----------------------------------------------------------------------------- pure math


def reset_masks(reset: Tensor | None, T: int, B: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """m (T, B): no restart since the segment start; mask (B, T, T): [t, tau] same episode, tau <= t."""
    causal = torch.ones(T, T, dtype=torch.bool, device=like.device).tril()
    if reset is None or not bool(reset.any()):
        return like.new_ones(T, B), causal.to(like.dtype).expand(B, T, T)
    episode = reset.long().cumsum(0).t()  # (B, T): index of the episode each step belongs to
    same = episode[:, :, None] == episode[:, None, :]
    return (episode.t() == 0).to(like.dtype), (same & causal).to(like.dtype)


def history_readout(W0: Tensor, s: Tensor, m: Tensor) -> Tensor:
    """m(t) W(t0) s(t): W0 (B, N, N), s (T, B, N), m (T, B) -> (T, B, N)."""
    return torch.einsum("bij,tbj->tbi", W0, s) * m[:, :, None]


def history_gradients(
    e: Tensor, s: Tensor, m: Tensor, sens: FWPSensitivity
) -> tuple[Tensor, Tensor]:
    """dL/dK, dL/dV through W(t0) with the rank-one E(t) = outer(e(t), s(t)): O(T B N D).

    e = dL/dy (T, B, N); s (T, B, N); m (T, B). dK = sum s (e^T Kh), dV = sum e (s^T Vh).
    """
    em_ = e * m[:, :, None]
    eK = torch.einsum("tbi,bid->tbd", em_, sens.Kh)  # (T, B, D)
    sV = torch.einsum("tbj,bjd->tbd", s, sens.Vh)  # (T, B, D)
    dK = torch.einsum("tbj,tbd->jd", s, eK)
    dV = torch.einsum("tbi,tbd->id", em_, sV)
    return dK, dV


def carry_segment(
    W0: Tensor,
    sens: FWPSensitivity | None,
    k: Tensor,
    v: Tensor,
    x: Tensor,
    m_last: Tensor,
    mask_last: Tensor,
) -> tuple[Tensor, FWPSensitivity | None]:
    """State at the segment end. k, v (T, B, N), x (T, B, D); m_last (B,); mask_last (B, T)."""
    g = mask_last.t()[:, :, None]  # (T, B, 1): step tau still counts at the end
    vg, kg = (v * g).permute(1, 2, 0), (k * g).permute(1, 2, 0)  # (B, N, T)
    W = torch.baddbmm(W0 * m_last[:, None, None], vg, k.transpose(0, 1))
    if sens is None:
        return W, None
    xb = x.transpose(0, 1)  # (B, T, D)
    Kh = torch.baddbmm(sens.Kh * m_last[:, None, None], vg, xb)
    Vh = torch.baddbmm(sens.Vh * m_last[:, None, None], kg, xb)
    return W, FWPSensitivity(Kh, Vh)


class _HistoryReadout(torch.autograd.Function):
    """y_hist = m W(t0) s; its backward returns d s and the history gradients of K and V."""

    @staticmethod
    def forward(ctx, s, m, W0, Kh, Vh, K, V):
        ctx.save_for_backward(s, m, W0, Kh, Vh)
        return history_readout(W0, s, m)

    @staticmethod
    def backward(ctx, e):
        s, m, W0, Kh, Vh = ctx.saved_tensors
        ds = torch.einsum("tbi,bij->tbj", e * m[:, :, None], W0)
        dK, dV = history_gradients(e, s, m, FWPSensitivity(Kh, Vh))
        return ds, None, None, None, None, dK, dV


# ----------------------------------------------------------------------------- the layer


class FWP(RecurrentCore):
    """One-layer fast weight programmer; rules "rtrl" (exact, untruncated) and "bptt".

    Parameters K, V, Q (N, D), initialised U(+-1/sqrt(D)). Output y (T, B, N).
    State: fast weights W (B, N, N) and, for "rtrl", Kh, Vh (B, N, D).
    """

    RULES = RULES
    State = FWPState

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "rtrl",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(input_size, hidden_size, rule)
        N, D = hidden_size, input_size
        kw = {"device": device, "dtype": dtype}
        self.K = nn.Parameter(torch.empty(N, D, **kw))
        self.V = nn.Parameter(torch.empty(N, D, **kw))
        self.Q = nn.Parameter(torch.empty(N, D, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.input_size)
        for p in (self.K, self.V, self.Q):
            p.uniform_(-bound, bound)

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> FWPState:
        with_sens = self.wants_sensitivities(batch_size, with_sensitivities)
        N, D = self.hidden_size, self.input_size
        kw = {"device": self.K.device, "dtype": self.K.dtype}
        W = torch.zeros(batch_size, N, N, **kw)
        if not with_sens:
            return FWPState(W, None)
        return FWPState(
            W,
            FWPSensitivity(
                torch.zeros(batch_size, N, D, **kw), torch.zeros(batch_size, N, D, **kw)
            ),
        )

    def state_tensors(self, state: FWPState, batch_size: int) -> list[StateTensor]:
        B, N, D = batch_size, self.hidden_size, self.input_size
        out = [("W", state.W, (B, N, N))]
        if state.sens is not None:
            out += [("sens.Kh", state.sens.Kh, (B, N, D)), ("sens.Vh", state.sens.Vh, (B, N, D))]
        return out

    def forward(
        self, x: Tensor, state: FWPState, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, FWPState]:
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        sens = state.sens
        tracks_history = self.tracks_history(state)
        N = self.hidden_size
        kvq = torch.nn.functional.linear(x, torch.cat([self.K, self.V, self.Q]))  # (T, B, 3N)
        k, v, q = kvq[..., :N], kvq[..., N : 2 * N], kvq[..., 2 * N :]
        s = torch.sigmoid(q)
        m, mask = reset_masks(reset, T, B, x)  # (T, B), (B, T, T)
        W0 = state.W.detach()
        if tracks_history:
            y_hist = _HistoryReadout.apply(s, m, W0, sens.Kh, sens.Vh, self.K, self.V)
        else:
            y_hist = history_readout(W0, s, m)
        # causal linear attention inside the segment: (B, T, T) scores k(tau) . s(t)
        scores = torch.bmm(s.transpose(0, 1), k.permute(1, 2, 0)) * mask
        y = y_hist + torch.bmm(scores, v.transpose(0, 1)).transpose(0, 1)  # (T, B, N)

        with torch.no_grad():
            carried = sens if self.carries_sensitivities else None
            W, new_sens = carry_segment(
                W0, carried, k.detach(), v.detach(), x.detach(), m[-1], mask[:, -1]
            )
        return y, FWPState(W, new_sens)
