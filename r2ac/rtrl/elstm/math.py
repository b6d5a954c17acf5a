"""Pure tensor math of the eLSTM (docs/design.md, "The eLSTM layer"): recurrence, its BPTT, and the RTRL carry.

Notation (all element-wise, per stream b and unit i):

    cp(t)  = keep(t) * c(t-1)                      # c(t-1), zeroed where the stream was reset
    f(t)   = sigmoid(pre_f(t) + w_f * cp(t))       # pre_f = F x(t) + b_f
    z(t)   = tanh   (pre_z(t) + w_z * cp(t))       # pre_z = Z x(t) + b_z
    c(t)   = f(t) * cp(t) + (1 - f(t)) * z(t)
    fh(t)  = (cp(t) - z(t)) * f(t) * (1 - f(t))    # d c(t) / d pre_f(t)
    zh(t)  = (1 - f(t)) * (1 - z(t)^2)             # d c(t) / d pre_z(t)
    a(t)   = keep(t) * (f + w_f * fh + w_z * zh)   # d c(t) / d c(t-1), a diagonal Jacobian

Because the recurrent Jacobian is diagonal, the sensitivity of c_i to the i-th row of F obeys
Fh(t) = a(t) * Fh(t-1) + outer(fh(t), x(t)), and over a segment of S steps it unrolls to

    Fh(t0+S) = G * Fh(t0) + sum_tau outer(g(tau) * fh(tau), x(tau)),
    g(tau) = prod_{s=tau+1}^{t0+S} a(s),   G = prod_{s=t0+1}^{t0+S} a(s),

one batched GEMM per segment instead of one O(N*D) update per step (docs/rules/rtrl.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from r2ac.rtrl.elstm import native
from r2ac.rtrl.elstm.deferred import CarriedBuffer


class ELSTMSensitivity(CarriedBuffer):
    """d c(t) / d theta for the recurrent parameters (only the non-zero, diagonal part):

        FZ (B, 2, N, D): [k=0] d c_i / d F_ij, [k=1] d c_i / d Z_ij
        wb (B, 4, N):    d c_i / d (w_f, w_z, b_f, b_z)_i

    Built as `ELSTMSensitivity(FZ, wb)` and read as `.FZ`, `.wb` or `FZ, wb = sens`. It is
    also the buffer of the deferred in-place carry (r2ac.rtrl.elstm.deferred): a state returned by a
    forward under autograd may hold a carry still pending, which the first read runs.

    FZ is indexed (B, 2, N, D) but the layer stores it as a permuted view of a (B, D, 2, N)
    tensor (`zero_FZ`): the carry GEMM then writes each stream's (D, 2N) block with the long,
    aligned 2N side contiguous, ~15% faster than writing (2N, D) rows of odd length D = 257
    (bench core). Every function here accepts either layout; only speed depends on it.
    """

    __slots__ = ()

    def __init__(self, FZ: Tensor, wb: Tensor):
        super().__init__(FZ, wb)

    @property
    def FZ(self) -> Tensor:
        return self.tensors()[0]

    @property
    def wb(self) -> Tensor:
        return self.tensors()[1]


def zero_FZ(B: int, N: int, D: int, **tensor_kw) -> Tensor:
    """Zero FZ sensitivities, shape (B, 2, N, D), in the carry's storage layout (B, D, 2, N)."""
    return torch.zeros(B, D, 2, N, **tensor_kw).permute(0, 2, 3, 1)


class ELSTMState(NamedTuple):
    c: Tensor  # (B, N) cell state
    sens: ELSTMSensitivity | None  # None for rule "bptt" (and for acting without a carry)


class RecurrenceTrace(NamedTuple):
    """What one segment of the recurrence leaves behind for the RTRL carry (all (T, B, N))."""

    fh: Tensor
    zh: Tensor
    a: Tensor
    cp: Tensor


class GateTrace(NamedTuple):
    """What the recurrence's steps compute and the carry needs (all (T, B, N)): the gates
    f(t), z(t) and the reset-masked previous cell state cp(t)."""

    f: Tensor
    z: Tensor
    cp: Tensor


def recurrence_steps(
    pre_f: Tensor, pre_z: Tensor, w_f: Tensor, w_z: Tensor, c0: Tensor, keep: Tensor | None
) -> tuple[Tensor, GateTrace]:
    """Run the element-wise recurrence over a segment: c (T, B, N) and its gates.

    pre_f, pre_z: (T, B, N) input pre-activations (bias included); c0: (B, N);
    keep: (T, B, 1) with 0 where a stream restarts before step t, or None.
    """
    T = pre_f.shape[0]
    c_all = pre_f.new_empty(pre_f.shape)  # (T, B, N)
    f_all = torch.empty_like(c_all)
    z_all = torch.empty_like(c_all)
    cp_all = torch.empty_like(c_all) if keep is not None else None
    c = c0
    for t in range(T):
        cp = torch.mul(c, keep[t], out=cp_all[t]) if keep is not None else c
        f = torch.sigmoid(torch.addcmul(pre_f[t], w_f, cp), out=f_all[t])
        z = torch.tanh(torch.addcmul(pre_z[t], w_z, cp), out=z_all[t])
        c = torch.addcmul(z, f, cp - z, out=c_all[t])  # f * cp + (1 - f) * z
    if cp_all is None:  # no reset: cp(t) is just c(t-1)
        cp_all = torch.cat([c0.unsqueeze(0), c_all[:-1]], 0)
    return c_all, GateTrace(f_all, z_all, cp_all)


def local_derivatives(
    gates: GateTrace, w_f: Tensor, w_z: Tensor, keep: Tensor | None
) -> RecurrenceTrace:
    """fh, zh, a (module docstring) of every step from its gates, as one pass over (T, B, N)."""
    f, z, cp = gates
    one_minus_f = 1.0 - f
    fh = (cp - z) * f * one_minus_f
    zh = one_minus_f * (1.0 - z * z)
    a = f + w_f * fh + w_z * zh
    if keep is not None:
        a = a * keep
    return RecurrenceTrace(fh, zh, a, cp)


def recurrence_forward(
    pre_f: Tensor, pre_z: Tensor, w_f: Tensor, w_z: Tensor, c0: Tensor, keep: Tensor | None
) -> tuple[Tensor, RecurrenceTrace]:
    """`recurrence_steps`, then the local derivatives of every step: c (T, B, N) and the
    trace the backward and the carry read."""
    c_all, gates = recurrence_steps(pre_f, pre_z, w_f, w_z, c0, keep)
    return c_all, local_derivatives(gates, w_f, w_z, keep)


def recurrence_backward(
    dc_out: Tensor, trace: RecurrenceTrace, d_pre_f: Tensor, d_pre_z: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """BPTT through the recurrence of one segment.

    dc_out: (T, B, N) gradient arriving at each c(t) from outside the recurrence.
    Writes d pre_f, d pre_z (T, B, N) into the given buffers (views are fine) and returns
    d w_f, d w_z (N,) and d c0 (B, N) = d_hat(t0).
    """
    T = dc_out.shape[0]
    dc = dc_out  # (T, B, N) total gradient at c(t), accumulated in place from the end
    for t in range(T - 2, -1, -1):
        dc[t].addcmul_(trace.a[t + 1], dc[t + 1])
    torch.mul(dc, trace.fh, out=d_pre_f)
    torch.mul(dc, trace.zh, out=d_pre_z)
    d_w_f = (d_pre_f * trace.cp).sum((0, 1))
    d_w_z = (d_pre_z * trace.cp).sum((0, 1))
    d_c0 = dc[0] * trace.a[0]
    return d_w_f, d_w_z, d_c0


def carry_factors(a: Tensor) -> tuple[Tensor, Tensor]:
    """g(tau) = prod_{s > tau} a(s) (T, B, N) and G = prod_s a(s) (B, N); exact with zeros.

    A loop of T small products: faster than flip + cumprod + flip, and no division, so a
    reset (a = 0) needs no special case.
    """
    g = torch.empty_like(a)
    g[-1] = 1.0
    for t in range(a.shape[0] - 2, -1, -1):
        torch.mul(g[t + 1], a[t + 1], out=g[t])
    return g, g[0] * a[0]


def _carry_inputs(trace: RecurrenceTrace) -> tuple[Tensor, Tensor]:
    """u = g(tau) * [fh; zh](tau) (T, B, 2, N) and G (B, N) of a segment (module docstring)."""
    T, B, N = trace.fh.shape
    g, G = carry_factors(trace.a)
    u = g.new_empty(T, B, 2, N)  # written in place (no stack copy)
    torch.mul(g, trace.fh, out=u[:, :, 0])
    torch.mul(g, trace.zh, out=u[:, :, 1])
    return u, G


def _wb_increment(u: Tensor, cp: Tensor) -> Tensor:
    """sum_tau u(tau) * [cp, cp, 1, 1](tau) (B, 4, N); overwrites u to save a temporary."""
    u_sum = u.sum(0)
    return torch.cat([u.mul_(cp[:, :, None, :]).sum(0), u_sum], 1)


def _outer_sum(x: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """The GEMM operands of sum_tau outer(u(tau), x(tau)) per stream, as (D, 2N) blocks.

    Returns x as (B, D, T) and u as (B, T, 2N): strided views that BLAS takes without a copy.
    """
    T, B, _, N = u.shape
    return x.permute(1, 2, 0), u.view(T, B, 2 * N).transpose(0, 1)


def carry_segment(sens: ELSTMSensitivity, trace: RecurrenceTrace, x: Tensor) -> ELSTMSensitivity:
    """Sensitivities at the end of a segment from those at its start, with one batched GEMM.

    x: (T, B, D) the segment's inputs. Cost: B*2N*T*D multiply-adds plus one pass over FZ.
    Writes new tensors; `carry_segment_in_place` is the same carry over the old ones. In
    float32 on CPU the native kernel (r2ac.rtrl.elstm.native) does it in one pass.
    """
    stored = _stored_blocks(sens.FZ)  # (B, D, 2, N) or None
    if _native(stored, sens.wb, x):  # one pass: carry inputs, scale and GEMM fused
        new, wb = native.carry(stored, sens.wb, *trace, x)
        return ELSTMSensitivity(new.permute(0, 2, 3, 1), wb)
    _, B, N = trace.fh.shape
    D = x.shape[-1]
    u, G = _carry_inputs(trace)
    # Per stream: (D, T) @ (T, 2N) -> (D, 2N), the storage layout of FZ (see zero_FZ).
    new = torch.bmm(*_outer_sum(x, u)).view(B, D, 2, N)
    new.addcmul_(sens.FZ.permute(0, 3, 1, 2), G[:, None, None, :])
    wb = torch.addcmul(_wb_increment(u, trace.cp), sens.wb, G[:, None, :])
    return ELSTMSensitivity(new.permute(0, 2, 3, 1), wb)


def carry_from_gates(
    sens: ELSTMSensitivity,
    gates: GateTrace,
    keep: Tensor | None,
    w: tuple[Tensor, Tensor],
    x: Tensor,
    fused: bool = False,
    out: ELSTMSensitivity | None = None,
) -> ELSTMSensitivity:
    """The carry of a segment from its steps' gates (T, B, N), keep (T, B, 1) or None,
    w = (w_f, w_z) and inputs x (T, B, D): `local_derivatives`, then `carry_segment` (or
    `carry_step`, `fused` or not, for T = 1); in float32 on CPU both in the native kernel.

    `out`: sensitivities of the same streams in the layer's layout, either `sens`'s own
    tensors (a carry in place: the kernel reads each element before it writes it) or sharing
    no memory with them, that the native kernel writes the result into (returned); other
    paths (and other layouts) return new tensors, which the caller copies (`write_state`)."""
    stored = _stored_blocks(sens.FZ)  # (B, D, 2, N) or None
    if _native(stored, sens.wb, x):
        into = None if out is None else _native_output(out, stored, sens.wb)
        new, wb = native.carry_from_gates(stored, sens.wb, gates, keep, w, x, out=into)
        return ELSTMSensitivity(new.permute(0, 2, 3, 1), wb)
    trace = local_derivatives(gates, *w, keep)
    if x.shape[0] == 1:
        return carry_step(sens, trace, x, fused=fused)
    return carry_segment(sens, trace, x)


def _native_output(
    out: ELSTMSensitivity, stored: Tensor, wb: Tensor
) -> tuple[Tensor, Tensor] | None:
    """`out`'s blocks (B, D, 2, N) and wb (B, 4, N) if the native kernel can write them: the
    layer's layout, the shapes of the input's and no memory shared with it."""
    blocks = _stored_blocks(out.FZ)
    if blocks is None or not out.wb.is_contiguous():
        return None
    if blocks.shape != stored.shape or out.wb.shape != wb.shape:
        raise ValueError(
            f"carry: `out` holds {tuple(out.FZ.shape)} / {tuple(out.wb.shape)} sensitivities "
            f"for a carry of {tuple(stored.permute(0, 2, 3, 1).shape)} / {tuple(wb.shape)}"
        )
    for target, source in ((blocks, stored), (out.wb, wb)):
        in_place = target.data_ptr() == source.data_ptr() and target.stride() == source.stride()
        if _overlap(target, source) and not in_place:
            raise ValueError("carry: `out` shares memory with the sensitivities it carries")
    return blocks, out.wb


def _overlap(a: Tensor, b: Tensor) -> bool:
    """Whether two contiguous tensors' byte ranges overlap."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def _stored_blocks(FZ: Tensor) -> Tensor | None:
    """FZ's storage as per-stream (D, 2, N) blocks, (B, D, 2, N), if it has the layer's layout
    (`zero_FZ`); None for any other layout."""
    stored = FZ.permute(0, 3, 1, 2)
    return stored if stored.is_contiguous() else None


def _native(stored: Tensor | None, wb: Tensor, x: Tensor | None = None) -> bool:
    """Whether the native kernel takes these operands (`native.supports`) and is loaded."""
    return (
        stored is not None
        and wb.is_contiguous()
        and native.supports(stored, x)
        and native.load() is not None
    )


def in_place_ready(sens: ELSTMSensitivity) -> bool:
    """Whether `carry_segment_in_place` can write over these tensors (the layer's layout)."""
    return _stored_blocks(sens.FZ) is not None and sens.wb.is_contiguous()


def carry_segment_in_place(sens: ELSTMSensitivity, trace: RecurrenceTrace, x: Tensor) -> None:
    """`carry_segment` (or `carry_step` for T = 1) written over sens itself.

    The same numbers, to rounding, with one (B, 2, N, D) buffer instead of two: it stays in
    cache, and the GEMM accumulates into it (beta = 1) instead of a separate pass adding
    G * FZ(t0). Needs `in_place_ready(sens)`.
    """
    _, B, N = trace.fh.shape
    D = x.shape[-1]
    stored = _stored_blocks(sens.FZ)  # (B, D, 2, N)
    u, G = _carry_inputs(trace)
    stored.mul_(G[:, None, None, :])
    stored.view(B, D, 2 * N).baddbmm_(*_outer_sum(x, u))
    sens.wb.mul_(G[:, None, :]).add_(_wb_increment(u, trace.cp))


def history_and_carry_in_place(
    d_hat: Tensor, sens: ELSTMSensitivity, trace: RecurrenceTrace, x: Tensor
) -> tuple[Tensor, Tensor]:
    """`inject_gradients(d_hat, sens)`, then `carry_segment_in_place(sens, trace, x)`.

    Both read FZ(t0); in float32 on CPU the native kernel (r2ac.rtrl.elstm.native) does the history
    contraction, the scale by G and the carry GEMM in one pass over it instead of three.
    Returns the history gradients, as `inject_gradients` does.
    """
    stored = _stored_blocks(sens.FZ)  # (B, D, 2, N)
    if not _native(stored, sens.wb, x):
        grads = inject_gradients(d_hat, sens)
        carry_segment_in_place(sens, trace, x)
        return grads
    return native.carry_in_place(stored, sens.wb, *trace, x, d_hat)  # (2, N, D), (4, N)


def scale_and_add_outer(FZ: Tensor, a: Tensor, u: Tensor, x: Tensor) -> Tensor:
    """a * FZ + outer(u, x) per stream: FZ (B, 2, N, D), a (B, N), u (B, 2, N), x (B, D)."""
    return FZ * a[:, None, :, None] + u[..., None] * x[:, None, None, :]


def _scale_and_add_outer_eager(FZ: Tensor, a: Tensor, u: Tensor, x: Tensor) -> Tensor:
    out = torch.mul(FZ, a[:, None, :, None])
    return out.addcmul_(u[..., None], x[:, None, None, :])


_compiled_scale_and_add_outer = None


def _fused_scale_and_add_outer():
    """scale_and_add_outer compiled into one loop (reads FZ once, writes once)."""
    global _compiled_scale_and_add_outer
    if _compiled_scale_and_add_outer is None:
        _compiled_scale_and_add_outer = torch.compile(scale_and_add_outer, dynamic=False)
    return _compiled_scale_and_add_outer


def carry_step(
    sens: ELSTMSensitivity, trace: RecurrenceTrace, x: Tensor, fused: bool = False
) -> ELSTMSensitivity:
    """The classic per-step RTRL update (T = 1), element-wise and bandwidth-bound.

    FZ(t) = a(t) * FZ(t-1) + outer([fh; zh](t), x(t)). Eager PyTorch needs two passes over
    the new tensor; `fused=True` uses a torch.compile'd kernel that makes one (compiled once
    per shape, ~15 s on a 2-core CPU), reaching near memory-copy bandwidth (bench core).
    """
    fh, zh, a, cp = (v[0] for v in trace)  # (B, N) each
    u = torch.stack([fh, zh], 1)  # (B, 2, N)
    update = _fused_scale_and_add_outer() if fused else _scale_and_add_outer_eager
    FZ = update(sens.FZ, a, u, x[0])
    inc = torch.stack([fh * cp, zh * cp, fh, zh], 1)  # (B, 4, N)
    wb = torch.addcmul(inc, sens.wb, a[:, None, :])
    return ELSTMSensitivity(FZ, wb)


def inject_gradients(d_hat: Tensor, sens: ELSTMSensitivity) -> tuple[Tensor, Tensor]:
    """The history term of the exact gradient: d_hat(t0) contracted with the carried sensitivities.

    d_hat: (B, N) = dL_segment / dc(t0). Returns dL/d[F; Z] (2, N, D) and dL/d(w_f, w_z, b_f, b_z)
    (4, N). A memory-bound pass over FZ, summed over streams in the layout FZ is stored in
    (in float32 on CPU by the native kernel).
    """
    B, _, N, D = sens.FZ.shape
    stored = _stored_blocks(sens.FZ)  # (B, D, 2, N)
    if _native(stored, sens.wb):
        return native.history(stored, sens.wb, d_hat)
    d_wb = torch.einsum("bn,bkn->kn", d_hat, sens.wb)
    if stored is not None:  # the layer's own layout: one streaming multiply-add per stream
        acc = stored[0] * d_hat[0]
        for b in range(1, B):
            acc.addcmul_(stored[b], d_hat[b])
        return acc.permute(1, 2, 0), d_wb
    # Any other layout (e.g. a plain (B, 2, N, D) tensor): a batched GEMV per row of F and Z.
    rows = sens.FZ.permute(1, 2, 0, 3).reshape(2 * N, B, D)  # (2N, B, D), a view if contiguous
    weights = d_hat.t().repeat(2, 1).unsqueeze(1)  # (2N, 1, B)
    return torch.bmm(weights, rows).view(2, N, D), d_wb


def first_order_start(sens: ELSTMSensitivity, d_FZ: Tensor, d_wb: Tensor) -> Tensor:
    """The change of c(t0) to first order when the recurrent parameters move by d_theta:
    S(t0) . d_theta, (B, N), from the carried sensitivities.

    d_FZ: (2, N, D) = (F, Z) - (F, Z) at which S(t0) was carried; d_wb: (4, N) the same for
    (w_f, w_z, b_f, b_z). A learner that updates several times from one stored start state
    adds this to c(t0), so that a pass sees the effect of its own updates on the start state
    (docs/rules/passes.md, "First-order start state"). One pass over FZ, like the history term.
    """
    stored = _stored_blocks(sens.FZ)  # (B, D, 2, N) in the layer's layout
    if stored is not None and _native(stored, sens.wb):  # one pass over FZ
        FZ_part = native.start_sum(stored, d_FZ.permute(2, 0, 1)).sum(1)
    elif stored is not None:  # multiply and sum over D in blocks of 16 inputs, so that the
        # product stays in cache: 1.4 ms at (64, 69, 2, 256), one thread, warm, against 2.4
        # ms for one product of the whole (an einsum: 6 ms, it copies FZ for a batched GEMM)
        d_blocks = d_FZ.permute(2, 0, 1).contiguous()  # (D, 2, N)
        acc = stored.new_zeros(stored.shape[0], *stored.shape[2:])  # (B, 2, N)
        for d0 in range(0, stored.shape[1], 16):
            acc += (stored[:, d0 : d0 + 16] * d_blocks[d0 : d0 + 16]).sum(1)
        FZ_part = acc.sum(1)
    else:
        FZ_part = (sens.FZ * d_FZ).sum(-1).sum(1)
    return FZ_part + (sens.wb * d_wb).sum(1)
