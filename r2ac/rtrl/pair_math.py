"""Exact RTRL for recurrences that are element-wise in 2 x 2 blocks (RTU, LRU): pure functions.

Unit i holds a pair s_i = (s1_i, s2_i) (the real and imaginary part of a complex state, or the
RTU's c1, c2). One step, with cp(t) = keep(t) s(t-1) (zero where the stream restarts):

    a(t) = K cp(t) + gamma * u(t),   K = [[g, -phi], [phi, g]],  u(t) = [W1 x(t); W2 x(t)]
    s(t) = a(t)  (linear)   or   s(t) = act(a(t))  (non-linear RTU)

with g = r cos(theta), phi = r sin(theta), r = exp(-exp(nu_log)), theta = exp(theta_log): K is
multiplication by lambda = r e^{i theta}. The Jacobian d s(t) / d s(t-1) is block-diagonal,

    J(t) = keep(t) diag(d(t)) K        d(t) = act'(a(t)), or 1 for a linear recurrence,

so s_i depends on the parameters of unit i only, and the sensitivities are O(parameters):

    S_W[c][k, i, j] = d s_{k,i} / d W_c[i, j]    (B, C, 2, N, D)  C input maps (W1, W2 / B_re, B_im)
    S_v[m][k, i]    = d s_{k,i} / d v_m[i]       (B, M, 2, N)     M per-unit vectors (nu_log, ...)

    S(t) = J(t) S(t-1) + E(t)       E: the immediate derivative of s(t) at fixed cp(t)

Over a segment t0+1 .. t0+T, with P(tau) = J(t0+T) ... J(tau+1) (P(t0+T) = I) and
G = P(t0) = J(t0+T) ... J(t0+1), the recursion unrolls to

    S(t0+T) = G S(t0) + sum_tau P(tau) E(tau)

For W_c, E(tau) = diag(d) gamma e_c outer x(tau), so the sum is one batched GEMM
(B, C 2 N, T) @ (B, T, D); for the vectors it is an element-wise sum. In general P comes from
a loop of T 2 x 2 products per unit (`block_products`, the non-linear RTU).

Linear recurrences (linear RTU, LRU; `linear_carry`): everything is complex arithmetic per
unit. The product of rotations-with-decay is a rotation-with-decay, P(tau) = alive(tau)
lambda^(t0+T-tau) with alive(tau) = prod_{s > tau} keep(s), no loop. The immediate
derivatives for W2 are i times those for W1 (gamma e_2 = i gamma e_1, and K commutes with
i), so S_W2 = i S_W1 at all times from a zero start, whatever the weights were when each
step was taken: such a layer stores S_W1 only (C = 1) and `inject_gradients(..., tied=True)`
derives W2's history term from it (half the state, half the GEMM). And since P(tau) is a
per-unit complex power times a per-stream scalar alive(tau), the carry GEMM is one plain
(2N, T) @ (T, B D) product with alive folded into x. docs/rules/rtu.md derives all of it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class PairSensitivity(NamedTuple):
    """Exact RTRL sensitivities of the pair state s (B, 2, N) to the recurrent parameters."""

    W: Tensor  # (B, C, 2, N, D): d s_{k,i} / d W_c[i, j] for the C stored input maps (1 if tied)
    v: Tensor  # (B, M, 2, N):    d s_{k,i} / d v_m[i]    for the M per-unit vectors


# ----------------------------------------------------------------------------- parameters


def decay_rotation(nu_log: Tensor, theta_log: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """g = r cos(theta), phi = r sin(theta) with r = exp(-nu), nu = exp(nu_log), theta = exp(theta_log).

    Returns g, phi, nu, theta, all (N,).
    """
    nu, theta = torch.exp(nu_log), torch.exp(theta_log)
    r = torch.exp(-nu)
    return r * torch.cos(theta), r * torch.sin(theta), nu, theta


def phase_log_bound(max_phase: float) -> float:
    """The largest theta_log a unit keeps: theta = exp(theta_log) <= max_phase (the init's).

    theta is a phase, so the loss is periodic in it and nothing pulls a large theta back, while
    d lam / d theta_log = i theta lam grows with theta: a step that raises theta_log raises the
    next step's gradient by the same factor, and a run can climb to theta_log ~ 70 and overflow
    its traces. Bounding theta (projection after each optimiser step, `clamp_phase_`) cuts the
    loop; every phase of (0, max_phase] stays reachable and the gradient is unchanged.
    """
    return math.log(max_phase)


@torch.no_grad()
def clamp_phase_(theta_log: Tensor, max_phase: float) -> Tensor:
    """Project theta_log onto theta <= max_phase, in place (see `phase_log_bound`)."""
    return theta_log.clamp_(max=phase_log_bound(max_phase))


def trace_gamma(nu: Tensor) -> Tensor:
    """The RTU's input normalisation sqrt(1 - r^2), r = exp(-nu), as sqrt(-expm1(-2 nu)).

    expm1 keeps 1 - r^2 accurate when r is close to 1 (1 - r^2 ~ 2 nu), where the literal
    formula loses all digits in float32.
    """
    return torch.sqrt(-torch.expm1(-2.0 * nu))


def rotation_derivatives(
    g: Tensor, phi: Tensor, nu: Tensor, theta: Tensor
) -> dict[str, tuple[Tensor, Tensor]]:
    """(d g, d phi) with respect to nu_log and theta_log, each (N,).

    d r / d nu_log = -nu r, so d(g, phi)/d nu_log = -nu (g, phi); d theta / d theta_log = theta,
    so d(g, phi)/d theta_log = theta (-phi, g).
    """
    return {"nu_log": (-nu * g, -nu * phi), "theta_log": (-theta * phi, theta * g)}


# ----------------------------------------------------------------------------- 2 x 2 blocks


def rotate(g: Tensor, phi: Tensor, s: Tensor) -> Tensor:
    """K s with K = [[g, -phi], [phi, g]] per unit: s (..., 2, N), g, phi (N,) -> (..., 2, N)."""
    s1, s2 = s.unbind(-2)
    return torch.stack([g * s1 - phi * s2, g * s2 + phi * s1], -2)


def matvec2(A: Tensor, v: Tensor) -> Tensor:
    """Per-unit 2 x 2 times 2-vector: A (..., 2, 2, N), v (..., 2, N) -> (..., 2, N)."""
    return (A * v.unsqueeze(-3)).sum(-2)


def matmul2(A: Tensor, B: Tensor) -> Tensor:
    """Per-unit 2 x 2 product: A, B (..., 2, 2, N) -> A B (..., 2, 2, N)."""
    return (A.unsqueeze(-2) * B.unsqueeze(-4)).sum(-3)


def step_jacobians(g: Tensor, phi: Tensor, d: Tensor, keep: Tensor | None) -> Tensor:
    """J(t) = keep(t) diag(d(t)) K: d (T, B, 2, N), keep (T, B, 1) or None -> (T, B, 2, 2, N)."""
    K = torch.stack([torch.stack([g, -phi]), torch.stack([phi, g])])  # (2, 2, N)
    J = d.unsqueeze(-2) * K  # row k scaled by d_k
    return J if keep is None else J * keep[..., None, None]


def block_products(J: Tensor) -> tuple[Tensor, Tensor]:
    """P(tau) = J(T-1) ... J(tau+1) (T, B, 2, 2, N) and G = J(T-1) ... J(0) (B, 2, 2, N).

    A loop of T per-unit 2 x 2 products (the general, non-linear case); P(T-1) = I.
    """
    T = J.shape[0]
    P = torch.empty_like(J)
    P[T - 1] = 0.0
    P[T - 1, :, 0, 0] = 1.0
    P[T - 1, :, 1, 1] = 1.0
    for t in range(T - 1, 0, -1):
        P[t - 1] = matmul2(P[t], J[t])
    return P, matmul2(P[0], J[0])


# ----------------------------------------------------------------------------- carry, history


def input_directions(P: Tensor, gamma: Tensor, d: Tensor | None) -> Tensor:
    """u[t, b, c] = P(t) diag(d(t)) gamma e_c, the factor of x(t) in S_W[c]: (T, B, 2, 2, N).

    P (T, B, 2, 2, N); gamma (N,); d (T, B, 2, N) or None (linear). Index order (t, b, c, k, n).
    """
    u = P.transpose(-3, -2) * gamma  # column c of P, times gamma
    return u if d is None else u * d.unsqueeze(-2)


def carry_segment(
    sens: PairSensitivity, P: Tensor, G: Tensor, u: Tensor, x: Tensor, E_v: Tensor
) -> PairSensitivity:
    """S(t0+T) = G S(t0) + sum_tau P(tau) E(tau): one batched GEMM for the input maps.

    P (T, B, 2, 2, N); G (B, 2, 2, N); u (T, B, C, 2, N) from `input_directions`;
    x (T, B, D); E_v (T, B, M, 2, N) the immediate derivatives of s(t) for the vectors.
    """
    T, B, C, _, N = u.shape
    # contiguous operands: bmm on the strided views ran 2.5x slower (8.3 vs 3.3 ms at T=50,
    # B=32, N=128, D=257); the two copies are O(T B (N + D)), small next to the state
    x_bt = x.transpose(0, 1).contiguous()  # (B, T, D)
    W = torch.bmm(u.permute(1, 2, 3, 4, 0).reshape(B, C * 2 * N, T), x_bt)
    W = W.view(B, C, 2, N, -1)  # (B, C, 2, N, D)
    old = sens.W  # G S_W(t0): row k of G against the pair axis of S_W
    W.addcmul_(G[:, None, :, 0, :, None], old[:, :, 0:1])
    W.addcmul_(G[:, None, :, 1, :, None], old[:, :, 1:2])
    v = matvec2(G.unsqueeze(1), sens.v) + matvec2(P.unsqueeze(2), E_v).sum(0)
    return PairSensitivity(W, v)


def times_i(v: Tensor, dim: int = -2) -> Tensor:
    """Multiplication by i of pairs read as complex numbers: (re, im) -> (-im, re) along `dim`."""
    re, im = v.unbind(dim)
    return torch.stack([-im, re], dim)


def inject_gradients(
    d_hat: Tensor, sens: PairSensitivity, tied: bool = False
) -> tuple[Tensor, Tensor]:
    """History term: d_hat (B, 2, N) = dL_seg / ds(t0) contracted with S(t0).

    Returns dL/dW (C', N, D) and dL/dv (M, N). With `tied` (a linear recurrence, where
    S_W2 = i S_W1 and only S_W1 is stored, C = 1), C' = 2: dL/dW2 = d_hat . (i S_W1) =
    (i^T d_hat) . S_W1, with i^T (re, im) = (im, -re). The W contraction is one batched GEMV
    per unit n over the streams, reading S in its own layout (an einsum first copied it:
    2.3 vs 0.6 ms at B=32, N=128, D=257).
    """
    B, C, _, N, D = sens.W.shape
    w = torch.stack([d_hat, -times_i(d_hat)] if tied else [d_hat], -1)  # (B, 2, N, M')
    dW = d_hat.new_zeros(N, w.shape[-1], C, D)
    for c in range(C):
        for k in range(2):  # (N, M', B) @ (N, B, D), S read through a strided view
            dW[:, :, c].baddbmm_(w[:, k].permute(1, 2, 0), sens.W[:, c, k].transpose(0, 1))
    dv = torch.einsum("bkn,bmkn->mn", d_hat, sens.v)
    return dW.permute(1, 2, 0, 3).reshape(-1, N, D), dv


# ----------------------------------------------------------------------------- linear: complex


def complex_of_pairs(s: Tensor, dim: int = -2) -> Tensor:
    """Pairs (re, im) along `dim` -> complex tensor without that dim (copies unless laid out so)."""
    return torch.view_as_complex(s.movedim(dim, -1).contiguous())


def pairs_of_complex(z: Tensor, dim: int = -2) -> Tensor:
    """Complex tensor -> real view with the (re, im) pair inserted at `dim` (no copy)."""
    return torch.view_as_real(z).movedim(-1, dim)


def lambda_powers(nu: Tensor, theta: Tensor, T: int) -> tuple[Tensor, Tensor]:
    """lambda^(T-1-t) for t = 0 .. T-1 (T, N) and lambda^T (N,), complex; lambda = e^{-nu + i theta}."""
    k = torch.arange(T - 1, -1, -1, dtype=nu.dtype, device=nu.device)[:, None]  # (T, 1)
    return torch.polar(torch.exp(-k * nu), k * theta), torch.polar(torch.exp(-T * nu), T * theta)


def survival(keep: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """alive (T, B) = prod_{s > t} keep(s) and alive_all (B,) = prod_s keep(s); (None, None) without resets."""
    if keep is None:
        return None, None
    kk = keep[..., 0]  # (T, B)
    suffix = torch.flip(torch.cumprod(torch.flip(kk, [0]), 0), [0])  # prod_{s >= t} keep(s)
    return torch.cat([suffix[1:], torch.ones_like(kk[:1])]), suffix[0]


def rotate_accumulate(W: Tensor, S: Tensor, G: Tensor) -> None:
    """W += G S in place, G complex per (stream, unit): W, S (B, 2, N, D) pairs, G (B, N)."""
    g_re, g_im = G.real[:, :, None], G.imag[:, :, None]  # (B, N, 1)
    W[:, 0].addcmul_(S[:, 0], g_re).addcmul_(S[:, 1], -g_im)
    W[:, 1].addcmul_(S[:, 1], g_re).addcmul_(S[:, 0], g_im)


def linear_carry(
    sens: PairSensitivity,
    x: Tensor,
    cp: Tensor,
    u: Tensor,
    keep: Tensor | None,
    lam: tuple[Tensor, Tensor],
    gamma: Tensor,
    dlam: Tensor,
    dgamma: Tensor,
) -> PairSensitivity:
    """The segment carry of a linear recurrence s(t) = lambda cp(t) + gamma u(t) (no grad).

    sens.W (B, 1, 2, N, D) holds S_W1 only (tied); x (T, B, D); cp, u (T, B, 2, N);
    lam = (nu, theta) (N,); gamma (N,); dlam (M, N) complex and dgamma (M, N) real: the
    derivatives of lambda and gamma with respect to the M vectors, so that
    E_m(t) = dlam_m cp(t) + dgamma_m u(t). The new S_W is a permuted view of a (2, N, B, D)
    buffer: the GEMM's own output, whose (N, B, D) blocks are also what the history term reads.
    """
    T, B, D = x.shape
    N = gamma.shape[0]
    lam_pow, lam_T = lambda_powers(*lam, T)  # (T, N), (N,)
    alive, alive_all = survival(keep)
    G = lam_T.expand(B, N) if alive_all is None else lam_T * alive_all[:, None]  # (B, N)
    xa = x if alive is None else x * alive[..., None]  # alive(t) is a per-stream scalar of P(t)
    U = pairs_of_complex(gamma * lam_pow, 1).reshape(T, 2 * N)  # (T, 2N): gamma P(t) e_1
    W = torch.mm(U.t(), xa.reshape(T, B * D)).view(2, N, B, D).permute(2, 0, 1, 3)  # (B, 2, N, D)
    rotate_accumulate(W, sens.W[:, 0], G)
    P = (
        lam_pow[:, None, :] if alive is None else lam_pow[:, None, :] * alive[..., None]
    )  # (T, B, N)
    A = (P * complex_of_pairs(cp)).sum(0)  # sum_t P(t) cp(t), (B, N)
    Bu = (P * complex_of_pairs(u)).sum(0)  # sum_t P(t) u(t)
    E = dlam[:, None, :] * A + dgamma[:, None, :] * Bu  # (M, B, N)
    v = complex_of_pairs(sens.v) * G[:, None, :] + E.transpose(0, 1)  # (B, M, N)
    return PairSensitivity(W.unsqueeze(1), pairs_of_complex(v))


def zero_sensitivity(B: int, C: int, M: int, N: int, D: int, **kw) -> PairSensitivity:
    return PairSensitivity(torch.zeros(B, C, 2, N, D, **kw), torch.zeros(B, M, 2, N, **kw))


def ring_init(
    N: int, r_min: float, r_max: float, max_phase: float, generator=None, **kw
) -> tuple[Tensor, Tensor]:
    """nu_log, theta_log with |lambda| = r uniform on the ring r_min <= r <= r_max (in area:
    r^2 uniform) and theta uniform on (0, max_phase] (Orvieto et al. 2023, Sec. 3.3)."""
    u1 = torch.rand(N, generator=generator, **kw)
    u2 = 1.0 - torch.rand(N, generator=generator, **kw)  # (0, 1]: log(theta) stays finite
    nu = -0.5 * torch.log(u1 * (r_max**2 - r_min**2) + r_min**2)
    return torch.log(nu), torch.log(max_phase * u2)
