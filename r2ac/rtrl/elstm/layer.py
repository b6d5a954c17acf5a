"""The element-wise LSTM (eLSTM) layer with exact, untruncated RTRL gradients.

Public contract (docs/design.md, "The public layer contract"):

    layer = ELSTM(input_size=D, hidden_size=N, rule="rtrl")   # or "bptt"
    state = layer.initial_state(batch_size=B)
    h, state = layer(x, state, reset=reset)                   # x (T, B, D), reset (T, B) bool

How the exact gradient is obtained (docs/rules/rtrl.md): inside a segment, ordinary BPTT
(a hand-written backward through the element-wise recurrence); for everything before the
segment, the sensitivities carried in the state, contracted with d_hat(t0) = dL/dc(t0). Both
are in the backward of `_Segment`, one autograd function for the whole layer; the second part
is added when the segment was given the carried sensitivities. So one `loss.backward()` gives the RTRL
gradient, and the rule "bptt" is the same code without that term.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.rtrl.core import RecurrentCore, StateTensor
from r2ac.rtrl.elstm import gpu_carry
from r2ac.rtrl.elstm import math as em
from r2ac.rtrl.elstm.deferred import PendingCarry, ReadToken
from r2ac.rtrl.elstm.math import ELSTMSensitivity, ELSTMState
from r2ac.rtrl.state import cat_resets, keep_mask, write_state

# "snap1" is an alias of "rtrl": the recurrent Jacobian d c(t) / d c(t-1) is diagonal, so
# SnAp-1 drops nothing and is exact RTRL (docs/rules/snap1.md).
RULES = ("bptt", "rtrl", "snap1")


class _History:
    """What a segment's backward needs for its history term: the carried sensitivities S(t0)
    and, set after `_Segment.apply` (it needs the recurrence's trace), the segment's pending
    carry."""

    def __init__(self, sens: ELSTMSensitivity):
        self.sens = sens
        self.pending: PendingCarry | None = None
        self.token: ReadToken | None = None  # the graph's claim on S(t0), until its backward


class ELSTMTrace(NamedTuple):
    """What `ELSTM.act` keeps for `ELSTM.carry_traces`: the inputs and resets, the gates of
    every step and the cell state after the last step."""

    x: Tensor  # (T, B, D)
    reset: Tensor | None  # (T, B) bool
    gates: em.GateTrace  # f, z, cp: (T, B, N) each
    c: Tensor  # (B, N)


def _layer_forward(
    x: Tensor, params: tuple[Tensor, ...], c0: Tensor, keep: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, em.GateTrace]:
    """The layer's forward pass: h, c, o (T, B, N) and the gates of every step.

    params: F, Z, O (N, D), b_f, b_z, b_o, w_f, w_z (N,), W_o (N, N); keep (T, B, 1) or None.
    """
    F, Z, O, b_f, b_z, b_o, w_f, w_z, W_o = params
    T, B, _ = x.shape
    N = F.shape[0]
    pre = torch.nn.functional.linear(x, torch.cat([F, Z, O]), torch.cat([b_f, b_z, b_o]))
    c_all, gates = em.recurrence_steps(pre[..., :N], pre[..., N : 2 * N], w_f, w_z, c0, keep)
    o_pre = torch.addmm(pre[..., 2 * N :].reshape(T * B, N), c_all.view(T * B, N), W_o.t())
    o = torch.sigmoid_(o_pre).view(T, B, N)
    return o * c_all, c_all, o, gates


class _Segment(torch.autograd.Function):
    """The whole layer over one segment, with one hand-written backward.

    Inputs: x (T, B, D), the nine parameters, c0 (B, N), the reset mask, and for the history
    term a `_History` (None for rule "bptt" or without autograd). Outputs h (T, B, N),
    c (T, B, N) and the RTRL trace (non-differentiable).

    The backward is BPTT inside the segment; with a history it then contracts d_hat(t0) =
    dL/dc(t0) with the carried sensitivities (the gradient through every earlier segment) and
    runs the segment's pending carry, in place when nothing else reads them (r2ac.rtrl.elstm.deferred).
    One function instead of autograd's chain saves the graph bookkeeping, and the history term
    of F and Z becomes the start value (beta = 1) of their weight-gradient GEMM instead of a
    separate sum.
    """

    @staticmethod
    def forward(ctx, x, F, Z, O, b_f, b_z, b_o, w_f, w_z, W_o, c0, keep, history):
        h, c_all, o, gates = _layer_forward(x, (F, Z, O, b_f, b_z, b_o, w_f, w_z, W_o), c0, keep)
        trace = em.local_derivatives(gates, w_f, w_z, keep)
        carried = tuple(history.sens) if history is not None else ()  # FZ, wb of S(t0)
        ctx.save_for_backward(x, F, Z, O, W_o, c_all, o, *trace, *carried)
        ctx.history = history
        if history is not None:  # until this graph's backward (or its end), S(t0) is read
            history.token = history.sens.add_reader()
        ctx.mark_non_differentiable(c_all, *trace)
        return (h, c_all, *trace)

    @staticmethod
    def backward(ctx, dh, *_unused):
        x, F, Z, O, W_o, c_all, o, *rest = ctx.saved_tensors
        trace = em.RecurrenceTrace(*rest[:4])
        T, B, N = c_all.shape
        D = x.shape[-1]
        d_pre = dh.new_empty(T, B, 3 * N)
        d_o_pre = d_pre[..., 2 * N :]  # (T, B, N) view
        torch.mul(dh, c_all, out=d_o_pre)
        d_o_pre.mul_(o * (1.0 - o))
        d_o_flat = d_o_pre.reshape(T * B, N)
        dc_out = torch.addmm((dh * o).view(T * B, N), d_o_flat, W_o).view(T, B, N)
        d_W_o = d_o_flat.t() @ c_all.view(T * B, N)
        d_w_f, d_w_z, d_hat = em.recurrence_backward(
            dc_out, trace, d_pre[..., :N], d_pre[..., N : 2 * N]
        )
        d_pre_flat, x_flat = d_pre.view(T * B, 3 * N), x.reshape(T * B, D)
        d_b = d_pre_flat.sum(0)  # (3N,)
        # Weight gradients of F and Z: the segment's GEMM, which under rule "rtrl" starts
        # (beta = 1) from the history term d_hat(t0) . S(t0) instead of adding it afterwards.
        d_pre_FZ = d_pre_flat[:, : 2 * N].t()  # (2N, T*B)
        history = _history_gradient(ctx, d_hat, rest[4:])  # ((2, N, D), (4, N)) or None
        if history is None:
            d_FZ = d_pre_FZ @ x_flat  # (2N, D)
        else:
            hist_FZ, hist_wb = history  # fresh tensors, free to overwrite
            d_FZ = hist_FZ.reshape(2 * N, D).addmm_(d_pre_FZ, x_flat)
            d_w_f, d_w_z = d_w_f + hist_wb[0], d_w_z + hist_wb[1]
            d_b[:N] += hist_wb[2]
            d_b[N : 2 * N] += hist_wb[3]
        d_O = d_o_flat.t() @ x_flat
        d_x = None
        if ctx.needs_input_grad[0]:
            d_x = (d_pre_flat @ torch.cat([F, Z, O])).view(T, B, D)
        d_F, d_Z = d_FZ.view(2, N, D)
        d_b_f, d_b_z, d_b_o = d_b.view(3, N)
        no_grad = (None,) * 3  # c0 (the state is detached), keep, history
        return (d_x, d_F, d_Z, d_O, d_b_f, d_b_z, d_b_o, d_w_f, d_w_z, d_W_o, *no_grad)


def _history_gradient(ctx, d_hat, carried):
    """The history term d_hat(t0) . S(t0) of a segment's gradient, (dL/d[F; Z] (2, N, D),
    dL/d(w_f, w_z, b_f, b_z) (4, N)), or None without a history (rule "bptt").

    The gradient to c(t0) itself is not passed on: the state is detached (the segment start is
    where input gradients are truncated, under both rules). When the segment's carry is still
    pending and nothing else reads S(t0), the carry runs here too, in place over S(t0), fused
    with this contraction.
    """
    if not carried:
        return None
    FZ, wb = carried
    history = ctx.history
    history.sens.release_reader(history.token)
    pending = history.pending
    if pending is not None and pending.in_place_safe():  # S(t0) is read for the last time
        return pending.run_in_place(d_hat)
    return gpu_carry.history(d_hat, ELSTMSensitivity(FZ, wb))  # CUDA: a fused candidate


class ELSTM(RecurrentCore):
    """eLSTM layer (docs/design.md, "The eLSTM layer") trained by exact RTRL ("rtrl") or truncated BPTT ("bptt").

    Parameters carry the paper's names: input maps F, Z, O (N, D); recurrent vectors w_f, w_z
    (N,); biases b_f, b_z, b_o (N,); output-gate matrix W_o (N, N), applied to c(t), not
    recurrent. Only F, Z, w_f, w_z, b_f, b_z take part in the recurrence.

    Initialisation (see docs/rules/rtrl.md): F, Z, O ~ U(+-1/sqrt(D)) and W_o ~ U(+-1/sqrt(N))
    (PyTorch's default for linear maps, so pre-activations start O(1) whatever D is);
    w_f, w_z ~ N(0, 0.1^2) as in the reference code; b_f = 1 (start by remembering:
    f multiplies c(t-1)); b_z = b_o = 0.

    `fused_step=True` runs the per-step (T = 1) sensitivity update as one compiled kernel
    (torch.compile; a one-off compile of ~15 s per shape on CPU) instead of two eager passes.

    `inplace_carry=True` (rule "rtrl" under autograd): the sensitivity carry of a segment runs
    at the end of its backward, over the input state's buffers (r2ac.rtrl.elstm.deferred). The
    input state is then consumed: continue from the returned one (reusing the input raises).
    `False` carries eagerly into new buffers and leaves every input state intact.
    """

    RULES = RULES
    State = ELSTMState
    skips_carry = True
    has_first_order_start = True
    defers_carry = True

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "rtrl",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fused_step: bool = False,
        inplace_carry: bool = True,
    ):
        super().__init__(input_size, hidden_size, rule)
        self.fused_step = fused_step  # T = 1 carry through a torch.compile'd kernel
        self.inplace_carry = inplace_carry  # carry over the input state after the backward
        N, D = hidden_size, input_size
        kw = {"device": device, "dtype": dtype}
        self.F = nn.Parameter(torch.empty(N, D, **kw))
        self.Z = nn.Parameter(torch.empty(N, D, **kw))
        self.O = nn.Parameter(torch.empty(N, D, **kw))
        self.W_o = nn.Parameter(torch.empty(N, N, **kw))
        self.w_f = nn.Parameter(torch.empty(N, **kw))
        self.w_z = nn.Parameter(torch.empty(N, **kw))
        self.b_f = nn.Parameter(torch.empty(N, **kw))
        self.b_z = nn.Parameter(torch.empty(N, **kw))
        self.b_o = nn.Parameter(torch.empty(N, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        in_bound, rec_bound = 1.0 / math.sqrt(self.input_size), 1.0 / math.sqrt(self.hidden_size)
        for m in (self.F, self.Z, self.O):
            m.uniform_(-in_bound, in_bound)
        self.W_o.uniform_(-rec_bound, rec_bound)
        self.w_f.normal_(0.0, 0.1)
        self.w_z.normal_(0.0, 0.1)
        self.b_f.fill_(1.0)
        self.b_z.zero_()
        self.b_o.zero_()

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> ELSTMState:
        """Zero state for `batch_size` streams; for rule "rtrl" it carries zero sensitivities.

        `with_sensitivities=False` gives a light state (c only), for acting without a carry.
        """
        with_sens = self.wants_sensitivities(batch_size, with_sensitivities)
        N, D = self.hidden_size, self.input_size
        kw = {"device": self.F.device, "dtype": self.F.dtype}
        c = torch.zeros(batch_size, N, **kw)
        if not with_sens:
            return ELSTMState(c, None)
        sens = ELSTMSensitivity(
            em.zero_FZ(batch_size, N, D, **kw), torch.zeros(batch_size, 4, N, **kw)
        )
        return ELSTMState(c, sens)

    def state_tensors(self, state: ELSTMState, batch_size: int) -> list[StateTensor]:
        B, N, D = batch_size, self.hidden_size, self.input_size
        out = [("c", state.c, (B, N))]
        if state.sens is not None:  # reading them runs a carry still pending from the last segment
            FZ, wb = state.sens
            out += [("sens.FZ", FZ, (B, 2, N, D)), ("sens.wb", wb, (B, 4, N))]
        return out

    def forward(
        self, x: Tensor, state: ELSTMState, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, ELSTMState]:
        """h (T, B, N) and the state after the segment.

        With carry=False the returned state has no sensitivities (sens=None): use it when the
        next state is not needed. The gradient is unaffected.
        """
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        sens = state.sens
        history = _History(sens) if self.tracks_history(state) else None
        keep = keep_mask(reset, x.dtype)  # (T, B, 1) or None
        h, c_all, *trace = _Segment.apply(x, *self._params(), state.c.detach(), keep, history)
        new_sens = None
        if sens is not None and carry and self.carries_sensitivities:
            trace, x = em.RecurrenceTrace(*trace), x.detach()
            if history is not None and self.inplace_carry and em.in_place_ready(sens):
                # Deferred: the backward writes it over sens, unless the new state is read first.
                history.pending = PendingCarry(
                    sens,
                    out_of_place=lambda: self._carry(sens, trace, x),
                    in_place=lambda d: gpu_carry.history_and_carry_in_place(d, sens, trace, x),
                )
                new_sens = ELSTMSensitivity.deferred(history.pending)
            else:
                with torch.no_grad():
                    new_sens = self._carry(sens, trace, x)
        return h, ELSTMState(c_all[-1].detach(), new_sens)

    def _carry(
        self, sens: ELSTMSensitivity, trace: em.RecurrenceTrace, x: Tensor
    ) -> ELSTMSensitivity:
        if x.shape[0] == 1:
            return em.carry_step(sens, trace, x, fused=self.fused_step)
        return em.carry_segment(sens, trace, x)

    @torch.no_grad()
    def advance_state(
        self, x: Tensor, state: ELSTMState, reset: Tensor | None = None
    ) -> ELSTMState:
        """The state after the segment, as `forward` returns it, without computing outputs.

        For actors that act with a light state and bring the full state (with sensitivities)
        up to date once per segment: it skips the output gate and the autograd bookkeeping.
        """
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        N = self.hidden_size
        pre = torch.nn.functional.linear(
            x, torch.cat([self.F, self.Z]), torch.cat([self.b_f, self.b_z])
        )  # (T, B, 2N)
        c_all, trace = em.recurrence_forward(
            pre[..., :N], pre[..., N:], self.w_f, self.w_z, state.c, keep_mask(reset, x.dtype)
        )
        sens = None
        if self.carries_sensitivities and state.sens is not None:
            sens = self._carry(state.sens, trace, x)
        return ELSTMState(c_all[-1], sens)

    @torch.no_grad()
    def act(
        self, x: Tensor, state: ELSTMState, reset: Tensor | None = None
    ) -> tuple[Tensor, ELSTMState, ELSTMTrace]:
        """h (T, B, N) as `forward` gives it, the light state after the steps, and a trace of
        their gates, from which `carry_traces` carries without re-running the recurrence."""
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        keep = keep_mask(reset, x.dtype)  # (T, B, 1) or None
        h, c_all, _, gates = _layer_forward(x, self._params(), state.c, keep)
        c = c_all[-1]  # (B, N)
        return h, ELSTMState(c, None), ELSTMTrace(x, reset, gates, c)

    def carry_weights(self) -> tuple[Tensor, Tensor]:
        """(w_f, w_z), copied: with the gates of the traces, all a carry reads."""
        return self.w_f.detach().clone(), self.w_z.detach().clone()

    @torch.no_grad()
    def carry_traces(
        self,
        state: ELSTMState,
        traces: Sequence[ELSTMTrace],
        out: ELSTMState | None = None,
        weights: tuple[Tensor, Tensor] | None = None,
    ) -> ELSTMState:
        """The state after the acted steps, with the sensitivities carried from `state`'s over
        the steps' gates (`elstm_math.carry_from_gates`: in float32 on CPU one pass of the
        native kernel, the local derivatives included; `state` is left intact unless it is
        `out`). `out` as in `RecurrentCore.carry_traces`: the native kernel writes its
        sensitivities there, `state`'s own included (in place). `weights`: `carry_weights()`
        taken when the traces were acted (default: the current w_f, w_z)."""
        c = traces[-1].c
        if not (self.carries_sensitivities and state.sens is not None):
            return write_state(out, ELSTMState(c, None))
        xs = [t.x for t in traces]
        gates = em.GateTrace(*(torch.cat(parts) for parts in zip(*(t.gates for t in traces))))
        x = torch.cat(xs)  # (T, B, D)
        keep = keep_mask(cat_resets([t.reset for t in traces], xs), x.dtype)  # (T, B, 1) | None
        w = (self.w_f, self.w_z) if weights is None else weights
        into = None if out is None else out.sens
        sens = em.carry_from_gates(state.sens, gates, keep, w, x, self.fused_step, out=into)
        return write_state(out, ELSTMState(c, sens))

    @torch.no_grad()
    def recurrent_snapshot(self) -> tuple[Tensor, Tensor]:
        """(F; Z) (2, N, D) and (w_f, w_z, b_f, b_z) (4, N), copied: the sensitivities' layout."""
        return torch.stack([self.F, self.Z]), torch.stack([self.w_f, self.w_z, self.b_f, self.b_z])

    @torch.no_grad()
    def first_order_start(self, state: ELSTMState, snapshot: tuple[Tensor, Tensor]) -> ELSTMState:
        """c(t0) + S(t0) . (theta - snapshot), the sensitivities kept (`RecurrentCore`)."""
        if state.sens is None:
            return state
        d_FZ, d_wb = (now - then for now, then in zip(self.recurrent_snapshot(), snapshot))
        return ELSTMState(state.c + em.first_order_start(state.sens, d_FZ, d_wb), state.sens)

    def _params(self) -> tuple[Tensor, ...]:
        """The parameters in `_layer_forward`'s order."""
        return (self.F, self.Z, self.O, self.b_f, self.b_z, self.b_o, self.w_f, self.w_z, self.W_o)


@torch.no_grad()
def chrono_forget_bias_(core: nn.Module, span: int) -> None:
    """Spread the cells' memory time scales over 2..span steps (chrono init, Tallec & Ollivier 2018).

    b_f = log(u), u ~ U(1, span - 1): ignoring the F x and w_f c terms, f = u / (1 + u), so a cell keeps
    c for about 1 / (1 - f) = 1 + u steps. The layer's default, b_f = 1, gives every cell a
    memory of ~3.7 steps. Used by the copy task (`--chrono-init`) and R2AC (`--chrono-span`);
    any core with a forget-gate bias `b_f` (the eLSTM, the feLSTM); draws from torch's global
    generator.
    """
    if span < 3:
        raise ValueError(f"chrono span must be >= 3, got {span}")
    core.b_f.uniform_(1.0, span - 1.0).log_()
