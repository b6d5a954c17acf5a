"""Stacked linear RTU and LRU: complex diagonal recurrences, one step, K agents' own weights.

Both are, per agent k and unit i (complex numbers; the state is stored in pairs s = s1 + i s2):

    s(t) = lam cp(t) + gamma u(t),   cp(t) = keep(t) s(t-1),   u(t) = W1 x(t) + i W2 x(t)

    RTU (r2ac.rtrl.rtu, the linear RTU): lam = exp(-nu + i theta), nu = exp(nu_log),
        theta = exp(theta_log), gamma = sqrt(1 - |lam|^2); output h = tanh([s1; s2]) (2U = N).
        Vectors v = (nu_log, theta_log).
    LRU (r2ac.rtrl.lru): the same lam, gamma = exp(gamma_log), W1 = B_re, W2 = B_im; output
        y = Re(C s) + D x = C_re s1 - C_im s2 + D x (N = U outputs). Vectors (nu_log,
        theta_log, gamma_log).

Exact RTRL (the module pair_math's derivation, one step): the Jacobian d s(t) / d s(t-1) is
multiplication by keep lam per unit, so with S_W[i, j] = d s_i / d W1[i, j] and
S_v[m, i] = d s_i / d v_m[i] (complex):

    S_W(t) = keep lam S_W(t-1) + gamma x(t)                 (K, U, D)
    S_v(t) = keep lam S_v(t-1) + dlam_m cp(t) + dgamma_m u(t)   (K, M, U)
    d s / d W2 = i S_W  (both immediate terms differ by i and lam commutes with i: tied)

and for a real loss with g = dL/ds1 + i dL/ds2 the gradient through the whole past is

    dL/dW1 = Re(conj(g) S_W),  dL/dW2 = -Im(conj(g) S_W),  dL/dv_m = Re(conj(g) S_v[m])

with S at the current step (carried part + this step's immediate part). `_PairRTRLStep`
does exactly this: its forward runs the step and the carry (no graph), its backward is the
contraction above (and dL/dx = W^T gamma g for this step only). The read-out (tanh, or
C s + D x) is plain autograd on top of s(t).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.stacked.base import (
    HiddenState,
    PairRTRLState,
    StackedCore,
    keep_factor,
)
from r2ac.rtrl.stacked.linear import linear, matvec, vecmat

# ----------------------------------------------------------------------------- coefficients


def rtu_coefficients(nu_log: Tensor, theta_log: Tensor) -> tuple[Tensor, Tensor]:
    """lam (K, U) complex and gamma = sqrt(1 - |lam|^2) (K, U) real (differentiable)."""
    nu = torch.exp(nu_log)
    lam = torch.exp(torch.complex(-nu, torch.exp(theta_log)))
    return lam, torch.sqrt(-torch.expm1(-2.0 * nu))


@torch.no_grad()
def rtu_derivatives(nu_log: Tensor, theta_log: Tensor):
    """lam, gamma and d lam / d v, d gamma / d v for v = (nu_log, theta_log): (K, 2, U) each.

    d lam / d nu_log = -nu lam, d lam / d theta_log = i theta lam;
    d gamma / d nu_log = nu |lam|^2 / gamma, d gamma / d theta_log = 0.
    """
    nu, theta = torch.exp(nu_log), torch.exp(theta_log)
    lam = torch.exp(torch.complex(-nu, theta))
    e = torch.expm1(-2.0 * nu)  # |lam|^2 - 1
    gamma = torch.sqrt(-e)
    dlam = torch.stack([-nu * lam, (1j * theta) * lam], 1)
    dgamma = torch.stack([nu * (1.0 + e) / gamma, torch.zeros_like(nu)], 1)
    return lam, gamma, dlam, dgamma


def lru_coefficients(nu_log: Tensor, theta_log: Tensor, gamma_log: Tensor):
    """lam (K, U) complex and gamma = exp(gamma_log) (K, U) (differentiable)."""
    lam = torch.exp(torch.complex(-torch.exp(nu_log), torch.exp(theta_log)))
    return lam, torch.exp(gamma_log)


@torch.no_grad()
def lru_derivatives(nu_log: Tensor, theta_log: Tensor, gamma_log: Tensor):
    """lam, gamma and d lam / d v, d gamma / d v for v = (nu_log, theta_log, gamma_log)."""
    nu, theta = torch.exp(nu_log), torch.exp(theta_log)
    lam = torch.exp(torch.complex(-nu, theta))
    gamma = torch.exp(gamma_log)
    zero = torch.zeros_like(nu)
    dlam = torch.stack([-nu * lam, (1j * theta) * lam, torch.zeros_like(lam)], 1)
    dgamma = torch.stack([zero, zero, gamma], 1)
    return lam, gamma, dlam, dgamma


# ----------------------------------------------------------------------------- one step


def pair_step(
    lam: Tensor, gamma: Tensor, u1: Tensor, u2: Tensor, s_prev: Tensor, keep: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """s(t) (K, U) complex from s_prev (K, 2, U) pairs and u1 = W1 x, u2 = W2 x (K, U).

    Also returns cp(t) and u(t) (K, U) complex. Differentiable (the TBPTT(1) rule uses it).
    """
    u = torch.complex(u1, u2)
    cp = torch.complex(s_prev[:, 0], s_prev[:, 1]) * keep.unsqueeze(1)
    return lam * cp + gamma * u, cp, u


def as_pairs(s: Tensor) -> Tensor:
    """(K, U) complex -> (K, 2, U) real pairs (s1; s2)."""
    return torch.stack([s.real, s.imag], 1)


class _PairRTRLStep(torch.autograd.Function):
    """One step of s(t) with the exact RTRL gradient (module doc). Inputs x, W1, W2, the
    derivative coefficients (no grad), s_prev, keep, S_W (planes), S_v (pairs) and the M vectors
    (only to receive their gradients). Outputs s(t) in pairs (K, 2, U) and the new S_W, S_v."""

    @staticmethod
    def forward(ctx, x, W1, W2, coef, s_prev, keep, S_W, S_v, *vectors):
        lam, gamma, dlam, dgamma = coef
        s, cp, u = pair_step(lam, gamma, matvec(W1, x), matvec(W2, x), s_prev, keep)
        lamk = lam * keep.unsqueeze(1)  # (K, U): the step's Jacobian, reset folded in
        S_W_new = lamk.unsqueeze(2) * torch.complex(S_W[:, 0], S_W[:, 1])  # (K, U, D)
        S_W_new.real.addcmul_(gamma.unsqueeze(2), x.unsqueeze(1))
        S_v_new = lamk.unsqueeze(1) * torch.view_as_complex(S_v)  # (K, M, U)
        S_v_new += dlam * cp.unsqueeze(1) + dgamma * u.unsqueeze(1)
        ctx.save_for_backward(W1, W2, gamma, S_W_new, S_v_new)
        out_W, out_v = torch.stack([S_W_new.real, S_W_new.imag], 1), torch.view_as_real(S_v_new)
        ctx.mark_non_differentiable(out_W, out_v)
        return as_pairs(s), out_W, out_v

    @staticmethod
    def backward(ctx, g_s, _g_W, _g_v):
        W1, W2, gamma, S_W, S_v = ctx.saved_tensors
        g_conj = torch.complex(g_s[:, 0], -g_s[:, 1])  # conj(dL/ds1 + i dL/ds2), (K, U)
        P = g_conj.unsqueeze(2) * S_W  # (K, U, D)
        g_v = (g_conj.unsqueeze(1) * S_v).real  # (K, M, U)
        g_x = None
        if ctx.needs_input_grad[0]:
            gg = g_s * gamma.unsqueeze(1)  # (K, 2, U)
            g_x = torch.baddbmm(vecmat(gg[:, 0], W1).unsqueeze(1), gg[:, 1:], W2).squeeze(1)
        return (g_x, P.real, -P.imag, None, None, None, None, None, *g_v.unbind(1))


def joined_maps(W1: Tensor, W2: Tensor) -> Tensor:
    """[W1; W2] (K, 2U, D): a view where W2 follows W1 in each agent's memory (the stacked
    layout, as the streaming agent keeps its parameters), else a copy."""
    K, U, D = W1.shape
    if (
        W1.stride() == W2.stride() == (W1.stride(0), D, 1)
        and W2.data_ptr() == W1.data_ptr() + U * D * W1.element_size()
    ):
        return W1.as_strided((K, 2 * U, D), W1.stride())
    return torch.cat([W1, W2], 1)


def _carry_planes(S: Tensor, lamk: Tensor, gamma: Tensor, x: Tensor) -> Tensor:
    """S_W(t) = lamk S_W(t-1) + gamma x^T in planes: S (K, 2, U, D) = (Re; Im), lamk (K, U)
    complex, gamma (K, U), x (K, D). Real ops on contiguous planes (a complex multiply of
    interleaved pairs, broadcast over D, is ~2x slower on a CPU)."""
    A, B = S[:, 0], S[:, 1]
    lr, li = lamk.real.unsqueeze(2), lamk.imag.unsqueeze(2)  # (K, U, 1)
    out = torch.empty_like(S)
    re, im = out[:, 0], out[:, 1]
    torch.mul(A, lr, out=re).addcmul_(B, li, value=-1.0).addcmul_(
        gamma.unsqueeze(2), x.unsqueeze(1)
    )
    torch.mul(B, lr, out=im).addcmul_(A, li)
    return out


# ----------------------------------------------------------------------------- the cores


class StackedPairCore(StackedCore):
    """What the stacked RTU and LRU share (state in pairs, the RTRL step, peek)."""

    vector_names: tuple[str, ...] = ()
    map_names: tuple[str, str] = ("W1", "W2")
    units: int

    def initial_state(self):
        K, U, D, M = self.num_agents, self.units, self.input_size, len(self.vector_names)
        s = self._zeros(K, 2, U)
        if self.rule == "bptt":
            return HiddenState(s)
        return PairRTRLState(s, self._zeros(K, 2, U, D), self._zeros(K, M, U, 2))

    def upper_bounds(self) -> dict[str, float]:
        return {"theta_log": pm.phase_log_bound(self.ring[2])}  # theta <= max_phase

    def sensitivity_numbers(self) -> int:
        if self.rule != "rtrl":
            return 0
        return 2 * self.units * (self.input_size + len(self.vector_names))

    def _coefficients(self, params):
        raise NotImplementedError

    def _derivatives(self, params):
        raise NotImplementedError

    def _readout(self, params, s_pairs: Tensor, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _inputs(self, params, x, grad: bool = True) -> tuple[Tensor, Tensor]:
        a, b = self.map_names
        if grad:
            return linear(params[a], x), linear(params[b], x)
        return matvec(params[a], x), matvec(params[b], x)

    def step(self, params, x, state, reset):
        keep = keep_factor(reset, x.dtype)
        if self.rule == "bptt":
            lam, gamma = self._coefficients(params)
            s, _, _ = pair_step(lam, gamma, *self._inputs(params, x), state.h.detach(), keep)
            s_pairs = as_pairs(s)
            return self._readout(params, s_pairs, x), HiddenState(s_pairs.detach())
        a, b = self.map_names
        vectors = [params[n] for n in self.vector_names]
        s_pairs, S_W, S_v = _PairRTRLStep.apply(
            x, params[a], params[b], self._derivatives(params), state.h, keep,
            state.sens_W, state.sens_v, *vectors,
        )  # fmt: skip
        return self._readout(params, s_pairs, x), PairRTRLState(s_pairs.detach(), S_W, S_v)

    # -- the hand-written gradient (no graph): the same math as _PairRTRLStep, plus the read-out

    def _manual_coefficients(self, params) -> tuple[Tensor, Tensor, tuple]:
        """lam (K, U) complex, gamma (K, U) and what `_immediate_v` needs."""
        raise NotImplementedError

    def _immediate_v(self, aux, lc: Tensor, u: Tensor, gu: Tensor) -> Tensor:
        """This step's d s / d v_m (K, M, U) complex: dlam_m cp + dgamma_m u, from lc = lam cp,
        u and gu = gamma u."""
        raise NotImplementedError

    def _readout_manual(self, params, s_pairs: Tensor, x: Tensor) -> tuple[Tensor, tuple]:
        raise NotImplementedError

    def _readout_backward(self, params, saved, g: Tensor, grads) -> tuple[Tensor, Tensor | None]:
        """dL/ds in pairs (K, 2, U) and the read-out's dL/dx (or None); writes its grads."""
        raise NotImplementedError

    @torch.no_grad()
    def forward_manual(self, params, x, state, reset):
        K, U = x.shape[0], self.units
        W = joined_maps(*(params[n] for n in self.map_names))  # (K, 2U, D)
        keep = keep_factor(reset, x.dtype).unsqueeze(1)  # (K, 1)
        lam, gamma, aux = self._manual_coefficients(params)
        u = torch.bmm(x.unsqueeze(1), W.transpose(1, 2)).view(K, 2, U)  # (W1 x; W2 x)
        u = torch.complex(u[:, 0], u[:, 1])  # (K, U)
        lc = lam * torch.complex(state.h[:, 0], state.h[:, 1]).mul_(keep)  # lam cp
        gu = gamma * u
        s_pairs = torch.view_as_real(lc + gu).transpose(1, 2).contiguous()  # (K, 2, U)
        imm_v = self._immediate_v(aux, lc, u, gu)  # (K, M, U)
        if self.rule == "rtrl":
            lamk = lam * keep  # the step's Jacobian, reset folded in
            S_W = _carry_planes(state.sens_W, lamk, gamma, x)  # (K, 2, U, D)
            S_v = torch.addcmul(imm_v, lamk.unsqueeze(1), torch.view_as_complex(state.sens_v))
            new_state = PairRTRLState(s_pairs, S_W, torch.view_as_real(S_v))
            sens = (S_W, S_v)
        else:
            new_state, sens = HiddenState(s_pairs), (None, imm_v)
        h, read = self._readout_manual(params, s_pairs, x)
        return h, new_state, (params, x, W, lam, gamma, sens, read)

    def backward_manual(self, saved, g_h, grads):
        params, x, W, _, gamma, (S_W, S_v), read = saved
        a, b = self.map_names
        g_s, g_x = self._readout_backward(params, read, g_h, grads)  # (K, 2, U)
        g_conj = torch.complex(g_s[:, 0], -g_s[:, 1])  # conj(dL/ds1 + i dL/ds2), (K, U)
        gg = g_s * gamma.unsqueeze(1)  # (K, 2, U): dL/du in pairs
        if S_W is None:  # TBPTT(1): d s / d W1 = gamma x^T (real), d s / d W2 = i gamma x^T
            torch.mul(gg[:, 0].unsqueeze(2), x.unsqueeze(1), out=grads[a])
            torch.mul(gg[:, 1].unsqueeze(2), x.unsqueeze(1), out=grads[b])
        else:  # dW1 = Re(conj(g) S_W), dW2 = -Im(conj(g) S_W), S_W = A + i B, g = gr + i gi
            A, B = S_W[:, 0], S_W[:, 1]  # (K, U, D) each
            gr, gi = g_s[:, 0].unsqueeze(2), g_s[:, 1].unsqueeze(2)
            torch.mul(A, gr, out=grads[a]).addcmul_(B, gi)  # gr A + gi B
            torch.mul(A, gi, out=grads[b]).addcmul_(B, gr, value=-1.0)  # gi A - gr B
        g_v = (g_conj.unsqueeze(1) * S_v).real  # (K, M, U)
        for m, name in enumerate(self.vector_names):
            grads[name].copy_(g_v[:, m])
        g_in = torch.bmm(gg.view(gg.shape[0], 1, -1), W).squeeze(1)  # (K, D)
        return g_in if g_x is None else g_in + g_x

    @torch.no_grad()
    def peek_manual(self, params, x, state, saved, rows: slice):
        """peek() without a reset, lam and gamma taken from rows `rows` of this step's
        forward_manual (the weights unchanged since)."""
        _, _, _, lam, gamma, _, _ = saved
        K, U = x.shape[0], self.units
        W = joined_maps(*(params[n] for n in self.map_names))
        u = torch.bmm(x.unsqueeze(1), W.transpose(1, 2)).view(K, 2, U)
        s = torch.complex(u[:, 0], u[:, 1]).mul_(gamma[rows])
        s.addcmul_(lam[rows], torch.complex(state.h[:, 0], state.h[:, 1]))
        s_pairs = torch.view_as_real(s).transpose(1, 2).contiguous()
        return self._readout_manual(params, s_pairs, x)[0]

    @torch.no_grad()
    def peek(self, params, x, state, reset):
        lam, gamma = self._coefficients(params)
        u1, u2 = self._inputs(params, x, grad=False)
        s, _, _ = pair_step(lam, gamma, u1, u2, state.h, keep_factor(reset, x.dtype))
        return self._readout(params, as_pairs(s), x)


class StackedRTU(StackedPairCore):
    """The linear RTU (r2ac.rtrl.rtu.RTU, nonlinear=False, tanh): hidden_size N = 2 x units,
    output (K, N) = tanh([c1; c2]). Parameters nu_log, theta_log (K, U), W1, W2 (K, U, D)."""

    vector_names = ("nu_log", "theta_log")

    def __init__(self, name, rule, num_agents, input_size, hidden_size, dtype, device=None):
        super().__init__(num_agents, input_size, hidden_size, dtype, device)
        self.name, self.rule = name, rule
        self.units = hidden_size // 2
        self.ring = (0.9, 0.999, 2 * math.pi)  # the module's defaults

    def param_shapes(self):
        U, D = self.units, self.input_size
        return {"nu_log": (U,), "theta_log": (U,), "W1": (U, D), "W2": (U, D)}

    def _draw(self, generator):
        U, D = self.units, self.input_size
        kw = {"dtype": self.dtype, "device": self.device}
        nu_log, theta_log = pm.ring_init(U, *self.ring, generator=generator, **kw)
        bound = 1.0 / math.sqrt(D)
        W1 = self._empty(U, D).uniform_(-bound, bound, generator=generator)
        W2 = self._empty(U, D).uniform_(-bound, bound, generator=generator)
        return {"nu_log": nu_log, "theta_log": theta_log, "W1": W1, "W2": W2}

    def _coefficients(self, params):
        return rtu_coefficients(params["nu_log"], params["theta_log"])

    def _derivatives(self, params):
        return rtu_derivatives(params["nu_log"], params["theta_log"])

    def _readout(self, params, s_pairs, x):
        return torch.tanh(s_pairs.reshape(s_pairs.shape[0], -1))  # (K, 2U): [c1; c2]

    def _manual_coefficients(self, params):
        nu, theta = torch.exp(params["nu_log"]), torch.exp(params["theta_log"])
        lam = torch.polar(torch.exp(-nu), theta)
        e = torch.expm1(-2.0 * nu)  # |lam|^2 - 1
        gamma = torch.sqrt(-e)
        return lam, gamma, (nu, theta, nu * (1.0 + e) / gamma)

    def _immediate_v(self, aux, lc, u, gu):
        # d/d nu_log: -nu lam cp + (nu |lam|^2 / gamma) u; d/d theta_log: i theta lam cp
        nu, theta, dgamma = aux
        return torch.stack([dgamma * u - nu * lc, lc * (theta * 1j)], 1)

    def _readout_manual(self, params, s_pairs, x):
        h = torch.tanh(s_pairs.view(s_pairs.shape[0], -1))
        return h, h

    def _readout_backward(self, params, h, g, grads):
        g_s = torch.ops.aten.tanh_backward(g, h)
        return g_s.view(g.shape[0], 2, -1), None


class StackedLRU(StackedPairCore):
    """The LRU (r2ac.rtrl.lru.LRU, state_size = hidden_size): U = N units, output (K, N) =
    Re(C s) + D x. Parameters nu_log, theta_log, gamma_log (K, N), B_re, B_im (K, N, D),
    C_re, C_im (K, N, N), D (K, N, D)."""

    vector_names = ("nu_log", "theta_log", "gamma_log")
    map_names = ("B_re", "B_im")

    def __init__(self, name, rule, num_agents, input_size, hidden_size, dtype, device=None):
        super().__init__(num_agents, input_size, hidden_size, dtype, device)
        self.name, self.rule = name, rule
        self.units = hidden_size
        self.ring = (0.9, 0.999, 2 * math.pi)

    def param_shapes(self):
        U, D, H = self.units, self.input_size, self.hidden_size
        return {
            "nu_log": (U,), "theta_log": (U,), "gamma_log": (U,), "B_re": (U, D),
            "B_im": (U, D), "C_re": (H, U), "C_im": (H, U), "D": (H, D),
        }  # fmt: skip

    def _draw(self, generator):
        U, D, H = self.units, self.input_size, self.hidden_size
        kw = {"dtype": self.dtype, "device": self.device}
        nu_log, theta_log = pm.ring_init(U, *self.ring, generator=generator, **kw)
        out = {"nu_log": nu_log, "theta_log": theta_log}
        out["gamma_log"] = torch.log(pm.trace_gamma(torch.exp(nu_log)))
        for name, shape, var in (
            ("B_re", (U, D), 0.5 / D),
            ("B_im", (U, D), 0.5 / D),
            ("C_re", (H, U), 1.0 / U),
            ("C_im", (H, U), 1.0 / U),
            ("D", (H, D), 1.0 / D),
        ):
            out[name] = self._empty(*shape).normal_(0.0, math.sqrt(var), generator=generator)
        return out

    def _coefficients(self, params):
        return lru_coefficients(params["nu_log"], params["theta_log"], params["gamma_log"])

    def _derivatives(self, params):
        return lru_derivatives(params["nu_log"], params["theta_log"], params["gamma_log"])

    def _readout(self, params, s_pairs, x):
        y = linear(params["D"], x, linear(params["C_re"], s_pairs[:, 0]))
        return y - linear(params["C_im"], s_pairs[:, 1])  # (K, H): Re(C s) + D x

    def _manual_coefficients(self, params):
        nu, theta = torch.exp(params["nu_log"]), torch.exp(params["theta_log"])
        return torch.polar(torch.exp(-nu), theta), torch.exp(params["gamma_log"]), (nu, theta)

    def _immediate_v(self, aux, lc, u, gu):
        nu, theta = aux  # d/d nu_log: -nu lam cp; d/d theta_log: i theta lam cp; gamma_log: gamma u
        return torch.stack([-nu * lc, lc * (theta * 1j), gu], 1)

    def _readout_manual(self, params, s_pairs, x):
        return self._readout(params, s_pairs, x), (x, s_pairs)

    def _readout_backward(self, params, saved, g, grads):
        x, s_pairs = saved
        torch.mul(g.unsqueeze(2), x.unsqueeze(1), out=grads["D"])
        torch.mul(g.unsqueeze(2), s_pairs[:, 0].unsqueeze(1), out=grads["C_re"])
        torch.mul(g.unsqueeze(2), -s_pairs[:, 1].unsqueeze(1), out=grads["C_im"])
        g_s = torch.stack([vecmat(g, params["C_re"]), -vecmat(g, params["C_im"])], 1)
        return g_s, vecmat(g, params["D"])
