"""Recurrent Trace Units (Elelimy, White, Bowling & White, NeurIPS 2024), exact RTRL or BPTT.

The real-valued form of the paper's RTUs (a complex diagonal recurrence written in pairs;
the exact form read from the paper and its code, esraaelelimy/rtus, src/nets/rtus/).
Each of the N = hidden_size / 2 units holds a pair (c1, c2); with cp(t) = keep(t) c(t-1):

    a1(t) = g cp1(t) - phi cp2(t) + gamma (W1 x(t))       W1, W2: (N, D)
    a2(t) = g cp2(t) + phi cp1(t) + gamma (W2 x(t))
    g = r cos(theta), phi = r sin(theta), r = exp(-exp(nu_log)), theta = exp(theta_log),
    gamma = sqrt(1 - r^2)                                   nu_log, theta_log: (N,)

    linear RTU      c(t) = a(t),        h(t) = act([c1(t); c2(t)])
    non-linear RTU  c(t) = act(a(t)),   h(t) = [c1(t); c2(t)]

h is the concatenation of both parts, (T, B, 2N = hidden_size), as in the paper's "linear RTU"
(linear recurrence, non-linear output) and "non-linear RTU" (the non-linearity inside the
recurrence). act is tanh (default, the released code's configuration) or relu.

All four parameters take part in the recurrence. Rule "rtrl" carries exact sensitivities
(r2ac.rtrl.pair_math): 2 N D + 4 N numbers per stream for the linear RTU (a linear
recurrence has d c / d W2 = i d c / d W1, read as complex numbers, so only one is carried),
4 N D + 4 N for the non-linear one: O(parameters); inside a segment the
gradient is plain BPTT, the history term d_hat(t0) . S(t0) enters through `_HistoryGradient`
(an identity on c(t0)), and the carry over a segment is one GEMM (with the segment's
product of rotations in closed form for the linear RTU). docs/rules/rtu.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.errors import ConfigError
from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.pair_core import PairCore

ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


class RTUState(NamedTuple):
    c: Tensor  # (B, 2, N): the pairs (c1, c2)
    sens: (
        pm.PairSensitivity | None
    )  # W: (B, 2, 2, N, D) for (W1, W2); v: (B, 2, 2, N) for (nu_log, theta_log)


# ----------------------------------------------------------------------------- pure math


def rtu_coefficients(
    nu_log: Tensor, theta_log: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """g, phi, gamma and the raw nu = exp(nu_log), theta = exp(theta_log); all (N,)."""
    g, phi, nu, theta = pm.decay_rotation(nu_log, theta_log)
    return g, phi, pm.trace_gamma(nu), nu, theta


def activation_derivative(a: Tensor, activation: str) -> Tensor:
    """act'(a) for the non-linear RTU's Jacobian (relu' at 0 is 0, as autograd's)."""
    if activation == "tanh":
        t = torch.tanh(a)
        return 1.0 - t * t
    return (a > 0).to(a.dtype)


def immediate_vector_derivatives(
    cp: Tensor,
    u: Tensor,
    d: Tensor,
    g: Tensor,
    phi: Tensor,
    gamma: Tensor,
    nu: Tensor,
    theta: Tensor,
) -> Tensor:
    """E_v(t) = d c(t) / d (nu_log, theta_log) at fixed cp(t), non-linear RTU: (T, B, 2, 2, N).

    cp, u (T, B, 2, N): previous state (reset-masked) and [W1 x; W2 x]; d = act'(a).
    d gamma / d nu_log = nu r^2 / gamma (gamma = sqrt(1 - r^2)).
    """
    der = pm.rotation_derivatives(g, phi, nu, theta)
    r2 = g * g + phi * phi
    e_nu = pm.rotate(*der["nu_log"], cp) + (nu * r2 / gamma) * u
    e_theta = pm.rotate(*der["theta_log"], cp)
    return torch.stack([e_nu, e_theta], 2) * d.unsqueeze(2)


def rtu_carry(
    sens: pm.PairSensitivity,
    x: Tensor,
    cp: Tensor,
    u: Tensor,
    a: Tensor,
    keep: Tensor | None,
    params: tuple[Tensor, Tensor],
    nonlinear: bool,
    activation: str,
) -> pm.PairSensitivity:
    """Sensitivities at the segment end from those at its start (no grad): x (T, B, D), cp, u, a (T, B, 2, N)."""
    g, phi, gamma, nu, theta = rtu_coefficients(*params)
    if not nonlinear:  # complex arithmetic: lambda = g + i phi, closed-form powers, tied W1/W2
        lam = torch.complex(g, phi)
        dlam = torch.stack([-nu * lam, 1j * theta * lam])  # d lambda / d (nu_log, theta_log)
        dgamma = torch.stack([nu * (g * g + phi * phi) / gamma, torch.zeros_like(nu)])
        return pm.linear_carry(sens, x, cp, u, keep, (nu, theta), gamma, dlam, dgamma)
    d = activation_derivative(a, activation)
    P, G = pm.block_products(pm.step_jacobians(g, phi, d, keep))
    E_v = immediate_vector_derivatives(cp, u, d, g, phi, gamma, nu, theta)
    return pm.carry_segment(sens, P, G, pm.input_directions(P, gamma, d), x, E_v)


class _HistoryGradient(torch.autograd.Function):
    """Identity on c(t0); its backward adds d_hat(t0) . S(t0) to nu_log, theta_log, W1, W2."""

    @staticmethod
    def forward(ctx, c0, S_W, S_v, nu_log, theta_log, W1, W2):
        ctx.save_for_backward(S_W, S_v)
        return c0.clone()

    @staticmethod
    def backward(ctx, d_hat):
        S_W, S_v = ctx.saved_tensors
        tied = S_W.shape[1] == 1  # linear RTU: S_W2 = i S_W1 is not stored
        dW, dv = pm.inject_gradients(d_hat, pm.PairSensitivity(S_W, S_v), tied)
        return None, None, None, dv[0], dv[1], dW[0], dW[1]


# ----------------------------------------------------------------------------- the layer


class RTU(PairCore):
    """RTU layer (module doc): hidden_size = 2N outputs from N trace units; rules "rtrl", "bptt".

    `nonlinear=False` (default) is the paper's linear RTU, `True` the non-linear one;
    `activation` is "tanh" (default) or "relu". Initialisation: r uniform in area on the ring
    [r_min, r_max] (default [0.9, 0.999], LRU Sec. 3.3; the RTU code draws r in [0, 1]),
    theta uniform on (0, max_phase = 2 pi], W1, W2 ~ U(+-1/sqrt(D)).
    """

    State = RTUState
    pair_field = "c"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "rtrl",
        nonlinear: bool = False,
        activation: str = "tanh",
        r_min: float = 0.9,
        r_max: float = 0.999,
        max_phase: float = 2 * math.pi,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(input_size, hidden_size, rule)
        if hidden_size % 2:
            raise ConfigError(
                f"RTU: hidden_size is 2 x units (c1 and c2 concatenated), must be even, got {hidden_size}"
            )
        if activation not in ACTIVATIONS:
            raise ConfigError(
                f"RTU: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}"
            )
        if not 0.0 < r_min <= r_max < 1.0:
            raise ConfigError(f"RTU: need 0 < r_min <= r_max < 1, got r_min={r_min}, r_max={r_max}")
        self.units = hidden_size // 2
        self.nonlinear, self.activation = nonlinear, activation
        # a linear recurrence has S_W2 = i S_W1, so it stores one input-map sensitivity, not two
        self.stored_maps = 2 if nonlinear else 1
        self.pair_units, self.vector_count = self.units, 2  # vectors: nu_log, theta_log
        self.ring = (r_min, r_max, max_phase)
        N, D = self.units, input_size
        kw = {"device": device, "dtype": dtype}
        self.nu_log = nn.Parameter(torch.empty(N, **kw))
        self.theta_log = nn.Parameter(torch.empty(N, **kw))
        self.W1 = nn.Parameter(torch.empty(N, D, **kw))
        self.W2 = nn.Parameter(torch.empty(N, D, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nu_log, theta_log = pm.ring_init(
            self.units, *self.ring, dtype=self.W1.dtype, device=self.W1.device
        )
        self.nu_log.copy_(nu_log)
        self.theta_log.copy_(theta_log)
        bound = 1.0 / math.sqrt(self.input_size)
        self.W1.uniform_(-bound, bound)
        self.W2.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        kind = "non-linear" if self.nonlinear else "linear"
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, rule={self.rule!r}, "
            f"{kind}, activation={self.activation!r}"
        )

    def _attach_history(self, c0: Tensor, sens: pm.PairSensitivity) -> Tensor:
        return _HistoryGradient.apply(
            c0, sens.W, sens.v, self.nu_log, self.theta_log, self.W1, self.W2
        )

    def _outputs(
        self, x: Tensor, c0: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
        T, B = x.shape[:2]
        c_all, cp_all, a_all, u = self._recurrence(x, c0, keep)
        h = c_all if self.nonlinear else ACTIVATIONS[self.activation](c_all)
        a_all = a_all if self.nonlinear else None  # a linear recurrence's carry needs no a
        return h.reshape(T, B, self.hidden_size), c_all, cp_all, a_all, u

    def _carry_sensitivities(
        self,
        sens: pm.PairSensitivity,
        x: Tensor,
        cp: Tensor,
        u: Tensor,
        a: Tensor | None,
        keep: Tensor | None,
    ) -> pm.PairSensitivity:
        params = (self.nu_log.detach(), self.theta_log.detach())
        return rtu_carry(sens, x, cp, u, a, keep, params, self.nonlinear, self.activation)

    def _recurrence(
        self, x: Tensor, c: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The step loop (autograd: BPTT inside the segment). Returns c, cp, a (T, B, 2, N) and u."""
        T, B = x.shape[:2]
        g, phi, gamma, _, _ = rtu_coefficients(self.nu_log, self.theta_log)
        u = torch.nn.functional.linear(x, torch.cat([self.W1, self.W2])).view(T, B, 2, self.units)
        gu = gamma * u  # (T, B, 2, N)
        gus = gu.unbind(
            0
        )  # one backward for all steps (indexing gu[t] would zero-fill (T, B, 2, N) per step)
        act = ACTIVATIONS[self.activation]
        cs, cps, as_ = [], [], []
        for t in range(T):
            cp = c if keep is None else c * keep[t][:, :, None]
            a = pm.rotate(g, phi, cp) + gus[t]
            c = act(a) if self.nonlinear else a
            cs.append(c)
            cps.append(cp)
            as_.append(a)
        return torch.stack(cs), torch.stack(cps), torch.stack(as_), u

    @torch.no_grad()
    def advance_state(self, x: Tensor, state: RTUState, reset: Tensor | None = None) -> RTUState:
        """The state after the segment (sensitivities carried), without keeping a graph."""
        return self.forward(x, state, reset)[1]
