"""The compiled step's RTU / LRU core in real (re, im) planes, with exact RTRL or TBPTT(1):
forward, gradients and the peek, as pure functions of tensors (StackedPairCore's manual forward
and backward, r2ac/rtrl/stacked/pair.py, operation for operation); and the per-row products the
layers use."""

from __future__ import annotations

import torch

from r2ac.rl.stream.compiled_spec import StepSpec
from r2ac.rtrl.stacked.base import HiddenState, PairRTRLState


def rows_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b per row, a (R, 1, I), b (R, I, O) -> (R, 1, O), as a product and a sum: inductor
    makes it a loop of its own kernels, where a bmm stays an ATen call (~5 us each at these
    sizes, ~30 a step)."""
    return (a.transpose(1, 2) * b).sum(1, keepdim=True)


def _matvec(W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """W x per row: W (R, N, D), x (R, D) -> (R, N) (r2ac.rtrl.stacked.linear.matvec)."""
    return rows_matmul(x.unsqueeze(1), W.transpose(1, 2)).squeeze(1)


def _vecmat(g: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    return rows_matmul(g.unsqueeze(1), W).squeeze(1)


# ---------------------------------------------------------------- the RTU / LRU core, real planes
# s = lam cp + gamma u per unit (complex), stored as (re; im) planes; pair.py's derivation.


def pair_coefficients(spec: StepSpec, p: dict):
    """lam (re, im), gamma (R, U) and the per-unit factors of d s / d v: (nu, theta, dgamma)
    for the RTU (dgamma = d gamma / d nu_log), (nu, theta) for the LRU."""
    nu, theta = torch.exp(p["nu_log"]), torch.exp(p["theta_log"])
    r = torch.exp(-nu)
    lam_re, lam_im = r * torch.cos(theta), r * torch.sin(theta)  # torch.polar(r, theta)
    if spec.cell == "rtu":
        e = torch.expm1(-2.0 * nu)  # |lam|^2 - 1
        gamma = torch.sqrt(-e)
        return lam_re, lam_im, gamma, (nu, theta, nu * (1.0 + e) / gamma)
    return lam_re, lam_im, torch.exp(p["gamma_log"]), (nu, theta)


def _cmul(ar, ai, br, bi):
    """(ar + i ai)(br + i bi) as (re, im)."""
    return ar * br - ai * bi, ar * bi + ai * br


def _immediate_v(spec: StepSpec, aux, lc_r, lc_i, ur, ui, gamma):
    """This step's d s / d v_m, (R, M, U) re and im: dlam_m cp + dgamma_m u."""
    if spec.cell == "rtu":  # nu_log: dgamma u - nu lam cp; theta_log: i theta lam cp
        nu, theta, dgamma = aux
        re = [dgamma * ur - nu * lc_r, -(theta * lc_i)]
        im = [dgamma * ui - nu * lc_i, theta * lc_r]
    else:  # nu_log: -nu lam cp; theta_log: i theta lam cp; gamma_log: gamma u
        nu, theta = aux
        re = [-nu * lc_r, -(theta * lc_i), gamma * ur]
        im = [-nu * lc_i, theta * lc_r, gamma * ui]
    return torch.stack(re, 1), torch.stack(im, 1)


def _maps(spec: StepSpec, p: dict) -> torch.Tensor:
    a, b = spec.maps
    return torch.cat([p[a], p[b]], 1)  # (R, 2U, D): (W1; W2)


def _readout(spec: StepSpec, p: dict, s_pairs: torch.Tensor, x: torch.Tensor):
    """The core's output (R, N) and what its backward needs."""
    if spec.cell == "rtu":
        h = torch.tanh(s_pairs.reshape(s_pairs.shape[0], -1))  # [c1; c2]
        return h, (h,)
    y = _matvec(p["D"], x) + _matvec(p["C_re"], s_pairs[:, 0])
    return y - _matvec(p["C_im"], s_pairs[:, 1]), (x, s_pairs)  # Re(C s) + D x


def _readout_grads(spec: StepSpec, p: dict, read, g: torch.Tensor):
    """dL/ds in pairs (R, 2, U), the read-out's own gradients and dL/dx (or None)."""
    if spec.cell == "rtu":
        (h,) = read
        return torch.ops.aten.tanh_backward(g, h).view(g.shape[0], 2, -1), {}, None
    x, s_pairs = read
    gc = g.unsqueeze(2)
    grads = {
        "D": gc * x.unsqueeze(1),
        "C_re": gc * s_pairs[:, 0].unsqueeze(1),
        "C_im": gc * (-s_pairs[:, 1]).unsqueeze(1),
    }
    g_s = torch.stack([_vecmat(g, p["C_re"]), -_vecmat(g, p["C_im"])], 1)
    return g_s, grads, _vecmat(g, p["D"])


def pair_forward(spec: StepSpec, p: dict, x: torch.Tensor, state: tuple, reset: torch.Tensor):
    """StackedPairCore.forward_manual: h (R, N), the next state, what pair_grads needs.
    x (R, D); state (h (R, 2, U)[, sens_W (R, 2, U, D), sens_v (R, M, U, 2)]); reset (R,)."""
    R, U = x.shape[0], spec.units
    W = _maps(spec, p)
    keep = (~reset).to(x.dtype).unsqueeze(1)  # (R, 1)
    lam_re, lam_im, gamma, aux = pair_coefficients(spec, p)
    u = rows_matmul(x.unsqueeze(1), W.transpose(1, 2)).view(R, 2, U)  # (W1 x; W2 x)
    ur, ui = u[:, 0], u[:, 1]
    lc_r, lc_i = _cmul(lam_re, lam_im, state[0][:, 0] * keep, state[0][:, 1] * keep)  # lam cp
    s_pairs = torch.stack([lc_r + gamma * ur, lc_i + gamma * ui], 1)  # (R, 2, U)
    imm_r, imm_i = _immediate_v(spec, aux, lc_r, lc_i, ur, ui, gamma)  # (R, M, U)
    if spec.rule == "rtrl":
        lk_r, lk_i = lam_re * keep, lam_im * keep  # the step's Jacobian, reset folded in
        A, B = state[1][:, 0], state[1][:, 1]  # (R, U, D) d s / d W1, re and im planes
        lr, li = lk_r.unsqueeze(2), lk_i.unsqueeze(2)
        # pair.py's _carry_planes op for op (addcmul: a fused multiply-add on the CPU)
        re = torch.addcmul(A * lr, B, li, value=-1.0).addcmul(gamma.unsqueeze(2), x.unsqueeze(1))
        S_W = torch.stack([re, torch.addcmul(B * lr, A, li)], 1)  # (R, 2, U, D)
        pr, pi = state[2][..., 0], state[2][..., 1]  # (R, M, U)
        cr, ci = _cmul(lk_r.unsqueeze(1), lk_i.unsqueeze(1), pr, pi)
        S_v = torch.stack([imm_r + cr, imm_i + ci], -1)  # (R, M, U, 2)
        new_state, imm = PairRTRLState(s_pairs, S_W, S_v), ()  # sensitivities: the state
    else:
        new_state, imm = HiddenState(s_pairs), torch.stack([imm_r, imm_i], -1)  # (R, M, U, 2)
    h, read = _readout(spec, p, s_pairs, x)
    return h, new_state, (x, lam_re, lam_im, gamma, imm, read)


def pair_grads(spec: StepSpec, p: dict, saved, state: tuple, g_h: torch.Tensor):
    """StackedPairCore.backward_manual: the core's gradients by name (R, ...) and dL/dx (R, D)
    for dL/dh = g_h (R, N); `state`: the step's new state (its sensitivities under RTRL)."""
    x, _, _, gamma, imm, read = saved
    a, b = spec.maps
    g_s, grads, g_x = _readout_grads(spec, p, read, g_h)  # (R, 2, U)
    gg = g_s * gamma.unsqueeze(1)  # (R, 2, U): dL/du in pairs
    gr, gi = g_s[:, 0], g_s[:, 1]
    if spec.rule == "rtrl":  # dW1 = Re(conj(g) S_W), dW2 = -Im(conj(g) S_W)
        _, S_W, S_v = state
        A, B = S_W[:, 0], S_W[:, 1]
        grc, gic = gr.unsqueeze(2), gi.unsqueeze(2)
        grads[a] = torch.addcmul(A * grc, B, gic)
        grads[b] = torch.addcmul(A * gic, B, grc, value=-1.0)
    else:  # TBPTT(1): d s / d W1 = gamma x^T, d s / d W2 = i gamma x^T
        S_v, xr = imm, x.unsqueeze(1)
        grads[a], grads[b] = gg[:, 0].unsqueeze(2) * xr, gg[:, 1].unsqueeze(2) * xr
    # dL/dv_m = Re(conj(g) S_v[m]) = gr Re S_v + gi Im S_v
    g_v = gr.unsqueeze(1) * S_v[..., 0] + gi.unsqueeze(1) * S_v[..., 1]  # (R, M, U)
    for m, name in enumerate(spec.vectors):
        grads[name] = g_v[:, m]
    g_in = rows_matmul(gg.view(gg.shape[0], 1, -1), _maps(spec, p)).squeeze(1)  # (R, D)
    return grads, (g_in if g_x is None else g_in + g_x)


def pair_peek(spec: StepSpec, p: dict, x: torch.Tensor, h_state: torch.Tensor, saved, rows: slice):
    """StackedPairCore.peek_manual: the output from state h_state (R', 2, U) and input x
    without a reset, lam and gamma from rows `rows` of this step's forward (weights unchanged)."""
    _, lam_re, lam_im, gamma, _, _ = saved
    R, U = x.shape[0], spec.units
    u = rows_matmul(x.unsqueeze(1), _maps(spec, p).transpose(1, 2)).view(R, 2, U)
    lc_r, lc_i = _cmul(lam_re[rows], lam_im[rows], h_state[:, 0], h_state[:, 1])
    g = gamma[rows]
    s_pairs = torch.stack([u[:, 0] * g + lc_r, u[:, 1] * g + lc_i], 1)
    return _readout(spec, p, s_pairs, x)[0]
