"""Elman RNN with full RTRL (Sec. 2, Eq. 1-4), per step or in the hybrid BPTT-RTRL form (A.4).

    h(t) = sigmoid(W x(t) + R h(t-1) + b)          W: (N, D), R: (N, N), b: (N,)

Write U = [W | R | b] (N, M) with M = D + N + 1 and u(t) = [x(t); hp(t); 1], where
hp(t) = keep(t) h(t-1) is the previous state zeroed where the stream restarts. Then
h(t) = sigmoid(U u(t)), and full RTRL carries the sensitivity of every unit to every parameter,

    P[b, k, i, j] = d h_k / d U_ij                  # (B, N, N, M): N^2 (N + D + 1) per stream

with d(t) = h(t) (1 - h(t)) and J(t) = keep(t) diag(d(t)) R = d h(t) / d h(t-1):

    per step (T = 1):  P(t) = J(t) P(t-1) + [k == i] d_k(t) u_j(t)          O(N^3 M) = O(N^4)

Over a segment t0+1 .. t0+T, with H(tau) = J(t0+T) ... J(tau+1) (H(t0+T) = I) and
A(tau) = H(tau) diag(d(tau)) = d h(t0+T) / d s(tau), the recursion unrolls to

    P(t0+T) = H(t0) P(t0) + sum_tau A(tau)[:, :, None] u(tau)[None, None, :]

H and A come from a backward loop of T (N, N) products, A(tau-1) = keep(tau) A(tau) R diag(d(tau-1)),
the sum is one batched GEMM (B, N^2, T) @ (B, T, M), and the only O(N^4) term, H(t0) P(t0),
is paid once per segment instead of once per step: O(N^4 + T N^3 + T N^2 M) per segment.

The gradient of the segment's loss is BPTT inside the segment (plain autograd) plus the
history term d_hat(t0) . P(t0), d_hat(t0) = dL_seg / dh(t0), added by `_HistoryGradient`
(an identity on h(t0)), the same construction as the eLSTM's (docs/rules/elman.md).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.errors import ConfigError
from r2ac.rtrl.core import RecurrentCore, StateTensor
from r2ac.rtrl.state import keep_mask

RULES = ("bptt", "rtrl")


class ElmanState(NamedTuple):
    h: Tensor  # (B, N)
    sens: Tensor | None  # (B, N, N, D + N + 1): d h_k / d [W | R | b]_ij; None for "bptt"


# ----------------------------------------------------------------------------- pure math


def inputs_u(x: Tensor, hp: Tensor) -> Tensor:
    """u(t) = [x(t); hp(t); 1]: (T, B, D) and (T, B, N) -> (T, B, D + N + 1)."""
    return torch.cat([x, hp, x.new_ones(*x.shape[:-1], 1)], -1)


def carry_step(sens: Tensor, h: Tensor, u: Tensor, keep: Tensor | None, R: Tensor) -> Tensor:
    """Classic per-step full RTRL: P(t) = J(t) P(t-1) + [k == i] d_k u_j.

    sens (B, N, N, M); h (B, N) = h(t); u (B, M) = u(t); keep (B, 1) or None; R (N, N).
    Cost O(B N^3 M): the product R P(t-1).
    """
    B, N, _, M = sens.shape
    d = h * (1.0 - h)  # (B, N)
    scale = d if keep is None else d * keep
    new = torch.matmul(R, sens.view(B, N, N * M))  # (B, N, N M)
    new.mul_(scale[:, :, None])
    new = new.view(B, N, N, M)
    new.diagonal(0, 1, 2).add_(u[:, :, None] * d[:, None, :])  # (B, M, N) view of k == i
    return new


def carry_segment(
    sens: Tensor, h_all: Tensor, u_all: Tensor, keep: Tensor | None, R: Tensor
) -> Tensor:
    """Hybrid BPTT-RTRL carry (A.4): P(t0+T) from P(t0) in one go.

    sens (B, N, N, M); h_all (T, B, N); u_all (T, B, M); keep (T, B, 1) or None.
    Cost: T (N, N) products for A, one (B, N^2, T) @ (B, T, M) GEMM, one (N, N) @ (N, N M)
    product per stream for H(t0) P(t0).
    """
    T, B, N = h_all.shape
    M = sens.shape[-1]
    d = h_all * (1.0 - h_all)  # (T, B, N)
    A = h_all.new_empty(T, B, N, N)  # A(tau)[k, i] = d h_k(t0+T) / d s_i(tau)
    A[T - 1] = torch.diag_embed(d[T - 1])
    for t in range(T - 1, 0, -1):
        H = torch.matmul(A[t], R)  # H(t-1) = H(t) J(t) without its diagonals
        if keep is not None:
            H.mul_(keep[t][:, :, None])
        torch.mul(H, d[t - 1][:, None, :], out=A[t - 1])
    H0 = torch.matmul(A[0], R)  # (B, N, N) = d h(t0+T) / d h(t0)
    if keep is not None:
        H0.mul_(keep[0][:, :, None])
    new = torch.bmm(H0, sens.view(B, N, N * M)).view(B, N * N, M)
    new.baddbmm_(A.permute(1, 2, 3, 0).reshape(B, N * N, T), u_all.transpose(0, 1))
    return new.view(B, N, N, M)


def inject_gradients(d_hat: Tensor, sens: Tensor) -> Tensor:
    """History term: sum_{b, k} d_hat[b, k] P[b, k, i, j] -> dL/dU (N, M). d_hat: (B, N)."""
    B, N, _, M = sens.shape
    return (d_hat.reshape(1, B * N) @ sens.reshape(B * N, N * M)).view(N, M)


def sensitivity_numel(input_size: int, hidden_size: int) -> int:
    """Values of the full RTRL sensitivity per stream: N^2 (N + D + 1)."""
    return hidden_size * hidden_size * (hidden_size + input_size + 1)


def device_memory_bytes(device: torch.device | str) -> int:
    """Total memory of `device` (physical RAM for the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no limit we can see
        return 2**63


def _gib(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:.0f} B"


def check_fits(
    input_size: int,
    hidden_size: int,
    batch_size: int,
    dtype: torch.dtype,
    device,
    limit: int | None,
) -> None:
    """Refuse sizes whose RTRL sensitivities (twice: old and new, during a carry) cannot fit."""
    per_stream = sensitivity_numel(input_size, hidden_size) * torch.finfo(dtype).bits // 8
    need = 2 * batch_size * per_stream
    limit = device_memory_bytes(device) if limit is None else limit
    if need > limit:
        raise ConfigError(
            f"Elman(rule='rtrl', N={hidden_size}, D={input_size}): full RTRL keeps N^2 (N + D + 1)"
            f" = {sensitivity_numel(input_size, hidden_size):,} sensitivities per stream"
            f" ({_gib(per_stream)} in {dtype}), {_gib(need)} for {batch_size} stream(s) during a"
            f" carry (old and new), more than the {_gib(limit)} of memory of {torch.device(device)};"
            " use a smaller hidden_size, rule='bptt', or an element-wise core (eLSTM)"
        )


class _HistoryGradient(torch.autograd.Function):
    """Identity on h(t0); its backward adds d_hat(t0) . P(t0) to the gradients of W, R, b."""

    @staticmethod
    def forward(ctx, h0, sens, W, R, b):
        ctx.save_for_backward(sens)
        ctx.D = W.shape[1]
        return h0.clone()

    @staticmethod
    def backward(ctx, d_hat):
        (sens,) = ctx.saved_tensors
        D, N = ctx.D, sens.shape[1]
        dU = inject_gradients(d_hat, sens)  # (N, D + N + 1)
        return None, None, dU[:, :D], dU[:, D : D + N], dU[:, D + N]


# ----------------------------------------------------------------------------- the layer


class Elman(RecurrentCore):
    """Elman RNN, h(t) = sigmoid(W x(t) + R h(t-1) + b), output h; rules "rtrl" and "bptt".

    "rtrl": exact, untruncated gradients via full RTRL sensitivities (B, N, N, D + N + 1),
    carried per step for T = 1 and with the hybrid BPTT-RTRL form for T > 1. Sizes whose
    sensitivities cannot fit in the device's memory are refused (ConfigError naming the
    memory); `memory_limit` (bytes) overrides the device's total memory.
    Initialisation: W ~ U(+-1/sqrt(D)), R ~ U(+-1/sqrt(N)), b = 0.
    """

    RULES = RULES
    State = ElmanState

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "rtrl",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        memory_limit: int | None = None,
    ):
        super().__init__(input_size, hidden_size, rule)
        self.memory_limit = memory_limit
        N, D = hidden_size, input_size
        kw = {"device": device, "dtype": dtype}
        if self.rule == "rtrl":  # before allocating anything
            check_fits(D, N, 1, dtype or torch.get_default_dtype(), device or "cpu", memory_limit)
        self.W = nn.Parameter(torch.empty(N, D, **kw))
        self.R = nn.Parameter(torch.empty(N, N, **kw))
        self.b = nn.Parameter(torch.empty(N, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.W.uniform_(-1 / math.sqrt(self.input_size), 1 / math.sqrt(self.input_size))
        self.R.uniform_(-1 / math.sqrt(self.hidden_size), 1 / math.sqrt(self.hidden_size))
        self.b.zero_()

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> ElmanState:
        """Zero state; for rule "rtrl" it carries zero sensitivities (checked to fit memory)."""
        with_sens = self.wants_sensitivities(batch_size, with_sensitivities)
        N, D = self.hidden_size, self.input_size
        kw = {"device": self.W.device, "dtype": self.W.dtype}
        h = torch.zeros(batch_size, N, **kw)
        if not with_sens:
            return ElmanState(h, None)
        check_fits(D, N, batch_size, self.W.dtype, self.W.device, self.memory_limit)
        return ElmanState(h, torch.zeros(batch_size, N, N, D + N + 1, **kw))

    def state_tensors(self, state: ElmanState, batch_size: int) -> list[StateTensor]:
        B, N, D = batch_size, self.hidden_size, self.input_size
        out = [("h", state.h, (B, N))]
        if state.sens is not None:
            out.append(("sens", state.sens, (B, N, N, D + N + 1)))
        return out

    def forward(
        self, x: Tensor, state: ElmanState, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, ElmanState]:
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        tracks_history = self.tracks_history(state)
        keep = keep_mask(reset, x.dtype)  # (T, B, 1) or None
        h = state.h.detach()
        if tracks_history:
            h = _HistoryGradient.apply(h, state.sens, self.W, self.R, self.b)
        pre = torch.nn.functional.linear(x, self.W, self.b)  # (T, B, N)
        hs, hps = [], []
        for t in range(T):
            hp = h if keep is None else h * keep[t]
            h = torch.sigmoid(torch.addmm(pre[t], hp, self.R.t()))
            hs.append(h)
            hps.append(hp)
        h_all = torch.stack(hs)  # (T, B, N)

        new_sens = None
        if self.carries_sensitivities and state.sens is not None:
            with torch.no_grad():
                u_all = inputs_u(x.detach(), torch.stack(hps).detach())  # (T, B, M)
                R, hd = self.R.detach(), h_all.detach()
                if T == 1:
                    new_sens = carry_step(
                        state.sens, hd[0], u_all[0], None if keep is None else keep[0], R
                    )
                else:
                    new_sens = carry_segment(state.sens, hd, u_all, keep, R)
        return h_all, ElmanState(h_all[-1].detach(), new_sens)
