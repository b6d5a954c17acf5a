"""Linear Recurrent Unit (Orvieto et al. 2023, Sec. 3), exact RTRL or BPTT, in real pairs.

Complex state h (N units, stored as (re, im) pairs), with hp(t) = keep(t) h(t-1):

    h(t) = Lambda hp(t) + gamma (B x(t))         Lambda = exp(-exp(nu_log) + i exp(theta_log))
    y(t) = Re(C h(t)) + D x(t)                   gamma = exp(gamma_log)

    B = B_re + i B_im (N, D_in), C = C_re + i C_im (H, N), D (H, D_in); nu_log, theta_log,
    gamma_log (N,). Output size H = hidden_size; state units N = state_size (default H).

As in the paper the layer is linear (its non-linearity lives in the block around it, which
here is the agent's heads). The paper's D is a diagonal skip (input and output widths equal);
here widths differ, so D is a full (H, D_in) matrix. Recurrent parameters: nu_log, theta_log,
gamma_log, B_re, B_im (exact sensitivities, r2ac.rtrl.pair_math: 2 N D_in + 6 N per stream,
since d h / d B_im = i d h / d B_re);
C_re, C_im and D are read out above the recurrence and get ordinary backprop.
In pairs, Lambda acts as the RTU's rotation-with-decay K, so the carry is the linear RTU's
(closed-form rotation powers, one batched GEMM); only gamma is free instead of sqrt(1 - r^2).
docs/rules/lru.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.errors import ConfigError
from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.pair_core import PairCore


class LRUState(NamedTuple):
    h: Tensor  # (B, 2, N): real and imaginary parts of the complex state
    sens: (
        pm.PairSensitivity | None
    )  # W: (B, 2, 2, N, D) for (B_re, B_im); v: (B, 3, 2, N) for (nu_log, theta_log, gamma_log)


# ----------------------------------------------------------------------------- pure math


def lru_carry(
    sens: pm.PairSensitivity,
    x: Tensor,
    hp: Tensor,
    u: Tensor,
    keep: Tensor | None,
    params: tuple[Tensor, Tensor, Tensor],
) -> pm.PairSensitivity:
    """Sensitivities at the segment end from those at its start (no grad): x (T, B, D), hp, u (T, B, 2, N).

    The linear RTU's carry (pair_math.linear_carry) with gamma free: E_nu = -nu Lambda hp,
    E_theta = i theta Lambda hp, E_gamma_log = gamma (B x).
    """
    nu_log, theta_log, gamma_log = params
    g, phi, nu, theta = pm.decay_rotation(nu_log, theta_log)
    gamma = torch.exp(gamma_log)
    lam = torch.complex(g, phi)
    zero = torch.zeros_like(lam)
    dlam = torch.stack(
        [-nu * lam, 1j * theta * lam, zero]
    )  # d Lambda / d (nu_log, theta_log, gamma_log)
    dgamma = torch.stack([torch.zeros_like(nu), torch.zeros_like(nu), gamma])
    return pm.linear_carry(sens, x, hp, u, keep, (nu, theta), gamma, dlam, dgamma)


class _HistoryGradient(torch.autograd.Function):
    """Identity on h(t0); its backward adds d_hat(t0) . S(t0) to the recurrent parameters."""

    @staticmethod
    def forward(ctx, h0, S_W, S_v, nu_log, theta_log, gamma_log, B_re, B_im):
        ctx.save_for_backward(S_W, S_v)
        return h0.clone()

    @staticmethod
    def backward(ctx, d_hat):
        S_W, S_v = ctx.saved_tensors
        dW, dv = pm.inject_gradients(d_hat, pm.PairSensitivity(S_W, S_v), tied=True)
        return None, None, None, dv[0], dv[1], dv[2], dW[0], dW[1]


# ----------------------------------------------------------------------------- the layer


class LRU(PairCore):
    """LRU layer (module doc); rules "rtrl" (exact) and "bptt" (truncated at segment starts).

    Initialisation (Orvieto et al. 2023, Sec. 3.3): |Lambda| uniform in area on the ring
    [r_min, r_max] (default [0.9, 0.999]), phase uniform on (0, max_phase = 2 pi],
    gamma_log = log sqrt(1 - |Lambda|^2); B_re, B_im ~ N(0, 1 / (2 D_in)); C_re, C_im ~ N(0, 1 / N);
    D ~ N(0, 1 / D_in) (a full matrix, so its outputs have unit scale like the paper's diagonal).
    """

    State = LRUState
    pair_field = "h"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "rtrl",
        state_size: int | None = None,
        r_min: float = 0.9,
        r_max: float = 0.999,
        max_phase: float = 2 * math.pi,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(input_size, hidden_size, rule)
        N = hidden_size if state_size is None else state_size
        if N < 1:
            raise ValueError(f"LRU: state_size must be positive, got {N}")
        if not 0.0 < r_min <= r_max < 1.0:
            raise ConfigError(f"LRU: need 0 < r_min <= r_max < 1, got r_min={r_min}, r_max={r_max}")
        self.state_size = N
        # one stored input map (B: its imaginary part's sensitivity is i times the real one's);
        # vectors: nu_log, theta_log, gamma_log
        self.pair_units, self.stored_maps, self.vector_count = N, 1, 3
        self.ring = (r_min, r_max, max_phase)
        H, D = hidden_size, input_size
        kw = {"device": device, "dtype": dtype}
        self.nu_log = nn.Parameter(torch.empty(N, **kw))
        self.theta_log = nn.Parameter(torch.empty(N, **kw))
        self.gamma_log = nn.Parameter(torch.empty(N, **kw))
        self.B_re = nn.Parameter(torch.empty(N, D, **kw))
        self.B_im = nn.Parameter(torch.empty(N, D, **kw))
        self.C_re = nn.Parameter(torch.empty(H, N, **kw))
        self.C_im = nn.Parameter(torch.empty(H, N, **kw))
        self.D = nn.Parameter(torch.empty(H, D, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nu_log, theta_log = pm.ring_init(
            self.state_size, *self.ring, dtype=self.B_re.dtype, device=self.B_re.device
        )
        self.nu_log.copy_(nu_log)
        self.theta_log.copy_(theta_log)
        self.gamma_log.copy_(torch.log(pm.trace_gamma(torch.exp(nu_log))))  # sqrt(1 - |Lambda|^2)
        for m, var in (
            (self.B_re, 0.5 / self.input_size),
            (self.B_im, 0.5 / self.input_size),
            (self.C_re, 1.0 / self.state_size),
            (self.C_im, 1.0 / self.state_size),
            (self.D, 1.0 / self.input_size),
        ):
            m.normal_(0.0, math.sqrt(var))

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, "
            f"state_size={self.state_size}, rule={self.rule!r}"
        )

    def _attach_history(self, h0: Tensor, sens: pm.PairSensitivity) -> Tensor:
        return _HistoryGradient.apply(
            h0,
            sens.W,
            sens.v,
            self.nu_log,
            self.theta_log,
            self.gamma_log,
            self.B_re,
            self.B_im,
        )

    def _outputs(
        self, x: Tensor, h0: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, None, Tensor]:
        T, B = x.shape[:2]
        h_all, hp_all, u = self._recurrence(x, h0, keep)  # (T, B, 2, N)
        C = torch.cat([self.C_re, -self.C_im], 1)  # (H, 2N): Re(C h) = C_re h_re - C_im h_im
        y = torch.addmm(x.reshape(T * B, -1) @ self.D.t(), h_all.reshape(T * B, -1), C.t())
        return y.view(T, B, self.hidden_size), h_all, hp_all, None, u  # y = Re(C h) + D x

    def _carry_sensitivities(
        self,
        sens: pm.PairSensitivity,
        x: Tensor,
        cp: Tensor,
        u: Tensor,
        a: Tensor | None,
        keep: Tensor | None,
    ) -> pm.PairSensitivity:
        params = (self.nu_log.detach(), self.theta_log.detach(), self.gamma_log.detach())
        return lru_carry(sens, x, cp, u, keep, params)

    def _recurrence(
        self, x: Tensor, h: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The step loop (autograd: BPTT inside the segment). Returns h, hp, u = B x, all (T, B, 2, N)."""
        T, B = x.shape[:2]
        g, phi, _, _ = pm.decay_rotation(self.nu_log, self.theta_log)
        u = torch.nn.functional.linear(x, torch.cat([self.B_re, self.B_im])).view(
            T, B, 2, self.state_size
        )
        gu = torch.exp(self.gamma_log) * u  # (T, B, 2, N)
        gus = gu.unbind(
            0
        )  # one backward for all steps (indexing gu[t] would zero-fill (T, B, 2, N) per step)
        hs, hps = [], []
        for t in range(T):
            hp = h if keep is None else h * keep[t][:, :, None]
            h = pm.rotate(g, phi, hp) + gus[t]
            hs.append(h)
            hps.append(hp)
        return torch.stack(hs), torch.stack(hps), u

    @torch.no_grad()
    def advance_state(self, x: Tensor, state: LRUState, reset: Tensor | None = None) -> LRUState:
        """The state after the segment (sensitivities carried), without keeping a graph."""
        return self.forward(x, state, reset)[1]
