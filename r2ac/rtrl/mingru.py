"""minGRU (Feng et al. 2024, "Were RNNs All We Needed?"), exact RTRL or BPTT.

Per unit (element-wise), with hp(t) = keep(t) h(t-1):

    z(t)  = sigmoid(W_z x(t) + b_z)                 W_z, W_h: (N, D); b_z, b_h: (N,)
    c(t)  = g(W_h x(t) + b_h)                       the candidate h~(t)
    h(t)  = (1 - z(t)) hp(t) + z(t) c(t)
    y(t)  = tanh(h(t))

g(a) = a + 1/2 for a >= 0, sigmoid(a) for a < 0 (the paper's log-space variant's g, so h > 0),
as the anchor's MinGRUCell (noahfarr/recurrent-streaming-rl, src/cells/min_gru.py, with
`output_activation_fn: tanh` in config/cell/min_gru.yaml); `candidate="linear"` is the
paper's plain minGRU (c = W_h x + b_h), `output="identity"` drops the tanh.

The gate and the candidate read the input only, so d h(t) / d h(t-1) = keep(t) (1 - z(t)) is
diagonal and exact RTRL carries, per unit i, d h_i / d W_z[i, :], d h_i / d W_h[i, :] (2 N D)
and d h_i / d b_z[i], d h_i / d b_h[i] (2 N): O(parameters). With a(t) = keep(t) (1 - z(t))
and the immediate terms e_z = (c - hp) z (1 - z), e_h = z g'(W_h x + b_h):

    S_W(t) = a(t) S_W(t-1) + e(t) x(t)^T,   S_b(t) = a(t) S_b(t-1) + e(t)

Inside a segment the gradient is BPTT (autograd through the step loop); the history term
d_hat(t0) . S(t0) enters through `_HistoryGradient` (an identity on h(t0)); the carry over a
segment is one batched GEMM with the suffix products of a (`mingru_carry`). docs/rules/mingru.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from r2ac.errors import ConfigError
from r2ac.rtrl.core import RecurrentCore, StateTensor
from r2ac.rtrl.state import keep_mask, write_state

CANDIDATES = ("g", "linear")
OUTPUTS = ("tanh", "identity")


class MinGRUSensitivity(NamedTuple):
    W: Tensor  # (B, 2, N, D): d h_i / d W_z[i, j], d h_i / d W_h[i, j]
    b: Tensor  # (B, 2, N): d h_i / d b_z[i], d h_i / d b_h[i]


class MinGRUState(NamedTuple):
    h: Tensor  # (B, N)
    sens: MinGRUSensitivity | None


class MinGRUTrace(NamedTuple):
    """What `MinGRU.act` keeps for `carry_traces`: what the carry reads, nothing re-run."""

    x: Tensor  # (T, B, D)
    a: Tensor  # (T, B, N) keep (1 - z): d h(t) / d h(t-1)
    e: Tensor  # (T, B, 2, N) d h / d (pre_z, pre_h) at fixed hp
    last: Tensor  # (B, N) h after the last step


# ----------------------------------------------------------------------------- pure math


def candidate_and_derivative(pre: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """c = g(pre) and g'(pre), no graph: g(a) = a + 1/2 for a >= 0 (derivative 1, as
    autograd of the `where` that defines it), sigmoid(a) below (derivative c (1 - c)); for
    "linear", pre and ones. g as sigmoid(min(a, 0)) + max(a, 0): the same numbers as that
    `where`, without its select (slow on a CPU)."""
    if kind == "linear":
        return pre, torch.ones_like(pre)
    s = torch.sigmoid(pre.clamp(max=0.0))  # 1/2 for a >= 0
    c = s + pre.clamp(min=0.0)
    dc = s * (1.0 - s)  # 1/4 for a >= 0, then 1 with the step added
    return c, dc.add_((pre >= 0).to(pre.dtype), alpha=0.75)


class _Candidate(torch.autograd.Function):
    """g(pre) whose backward multiplies by the g'(pre) its forward computed (returned too,
    non-differentiable: the carry reads it)."""

    @staticmethod
    def forward(ctx, pre):
        c, dc = candidate_and_derivative(pre, "g")
        ctx.save_for_backward(dc)
        ctx.mark_non_differentiable(dc)
        return c, dc

    @staticmethod
    def backward(ctx, grad, _grad_dc):
        (dc,) = ctx.saved_tensors
        return grad * dc


def candidate(pre: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """c = g(pre) (g(a) = a + 1/2 for a >= 0, sigmoid(a) below) or pre itself ("linear"),
    differentiable, and g'(pre) without a graph."""
    if kind == "linear":
        return pre, torch.ones_like(pre)
    if torch.is_grad_enabled() and pre.requires_grad:
        return _Candidate.apply(pre)
    return candidate_and_derivative(pre, kind)


def local_derivatives(
    z: Tensor, c: Tensor, dc: Tensor, hp: Tensor, keep: Tensor | None
) -> tuple[Tensor, Tensor]:
    """a = keep (1 - z) (..., N) and e = (e_z, e_h) (..., 2, N) from z, c, g'(pre_h) = dc and
    the reset-masked previous state hp; keep broadcastable to z, or None."""
    a = 1.0 - z if keep is None else (1.0 - z) * keep
    e = torch.stack([(c - hp) * z * (1.0 - z), z * dc], -2)
    return a, e


def mingru_carry(sens: MinGRUSensitivity, x: Tensor, a: Tensor, e: Tensor) -> MinGRUSensitivity:
    """S at the segment end from S at its start (no grad): x (T, B, D), a (T, B, N),
    e (T, B, 2, N). With P(t) = a(t+1) ... a(T) (P(T) = 1): S(T) = P(0) a(0) S(t0) +
    sum_t P(t) e(t) x(t)^T, the sum one (2N, T) @ (T, D) GEMM per stream."""
    T, B, N = a.shape
    after = torch.cumprod(a.flip(0), 0).flip(0)  # after[t] = a(t) ... a(T)
    suffix = torch.cat([after[1:], torch.ones_like(a[:1])])  # P(t)
    w = e * suffix.unsqueeze(2)  # (T, B, 2, N)
    total = after[0].unsqueeze(1)  # (B, 1, N)
    W = sens.W * total.unsqueeze(-1)  # a new tensor: the start state is left intact
    W.view(B, 2 * N, -1).baddbmm_(w.permute(1, 2, 3, 0).reshape(B, 2 * N, T), x.transpose(0, 1))
    b = torch.addcmul(w.sum(0), sens.b, total)
    return MinGRUSensitivity(W, b)


def history_gradients(d_hat: Tensor, sens: MinGRUSensitivity) -> tuple[Tensor, Tensor]:
    """d_hat (B, N) = dL/dh(t0) contracted with S(t0): dL/d[W_z; W_h] (2, N, D), dL/d[b_z; b_h]
    (2, N). The W part is one batched GEMV per row of [W_z; W_h] over the streams, reading S
    through a strided view (an einsum would first copy it)."""
    B, _, N, D = sens.W.shape
    rows = d_hat.t().repeat(2, 1).unsqueeze(1)  # (2N, 1, B)
    dW = torch.bmm(rows, sens.W.reshape(B, 2 * N, D).transpose(0, 1))  # (2N, 1, D)
    return dW.view(2, N, D), (d_hat.unsqueeze(1) * sens.b).sum(0)


class _HistoryGradient(torch.autograd.Function):
    """Identity on h(t0); its backward adds d_hat(t0) . S(t0) to W_z, W_h, b_z, b_h."""

    @staticmethod
    def forward(ctx, h0, S_W, S_b, W_z, W_h, b_z, b_h):
        ctx.save_for_backward(S_W, S_b)
        return h0.clone()

    @staticmethod
    def backward(ctx, d_hat):
        dW, db = history_gradients(d_hat, MinGRUSensitivity(*ctx.saved_tensors))
        return None, None, None, dW[0], dW[1], db[0], db[1]


# ----------------------------------------------------------------------------- the layer


class MinGRU(RecurrentCore):
    """minGRU layer (module doc): N = hidden_size units, output (T, B, N); rules "rtrl", "bptt".

    Initialisation as the anchor's: W_z, W_h lecun-normal (a normal of variance 1/D truncated
    at two standard deviations), b_z = b_h = 0.
    """

    RULES = ("bptt", "rtrl")
    State = MinGRUState
    skips_carry = True  # carry=False returns sens=None (an IMPALA learner drops the state)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "rtrl",
        candidate: str = "g",
        output: str = "tanh",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(input_size, hidden_size, rule)
        if candidate not in CANDIDATES:
            raise ConfigError(
                f"MinGRU: unknown candidate {candidate!r}; choose one of {', '.join(CANDIDATES)}"
            )
        if output not in OUTPUTS:
            raise ConfigError(
                f"MinGRU: unknown output {output!r}; choose one of {', '.join(OUTPUTS)}"
            )
        self.candidate, self.output = candidate, output
        N, D = hidden_size, input_size
        kw = {"device": device, "dtype": dtype}
        self.W_z = nn.Parameter(torch.empty(N, D, **kw))
        self.W_h = nn.Parameter(torch.empty(N, D, **kw))
        self.b_z = nn.Parameter(torch.empty(N, **kw))
        self.b_h = nn.Parameter(torch.empty(N, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        for W in (self.W_z, self.W_h):
            lecun_normal_(W, generator)
        self.b_z.zero_()
        self.b_h.zero_()

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, rule={self.rule!r}, "
            f"candidate={self.candidate!r}, output={self.output!r}"
        )

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> MinGRUState:
        with_sensitivities = self.wants_sensitivities(batch_size, with_sensitivities)
        ref = self._reference_tensor()
        kw = {"device": ref.device, "dtype": ref.dtype}
        N, D = self.hidden_size, self.input_size
        h = torch.zeros(batch_size, N, **kw)
        if not with_sensitivities:
            return MinGRUState(h, None)
        sens = MinGRUSensitivity(
            torch.zeros(batch_size, 2, N, D, **kw), torch.zeros(batch_size, 2, N, **kw)
        )
        return MinGRUState(h, sens)

    def state_tensors(self, state: MinGRUState, B: int) -> list[StateTensor]:
        N, D = self.hidden_size, self.input_size
        tensors = [("h", state.h, (B, N))]
        if state.sens is not None:
            tensors += [("sens.W", state.sens.W, (B, 2, N, D)), ("sens.b", state.sens.b, (B, 2, N))]
        return tensors

    def forward(
        self, x: Tensor, state: MinGRUState, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, MinGRUState]:
        """x (T, B, D), reset (T, B) bool or None -> y (T, B, N), state at the segment end.
        carry=False returns a state without sensitivities (for a caller that drops it)."""
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        keep = keep_mask(reset, x.dtype)  # (T, B, 1) or None
        h0 = state.h.detach()
        if self.tracks_history(state):
            sens = state.sens
            h0 = _HistoryGradient.apply(h0, sens.W, sens.b, self.W_z, self.W_h, self.b_z, self.b_h)
        y, hs, hps, gates = self._outputs(x, h0, keep)
        new_sens = None
        if self.rule == "rtrl" and state.sens is not None and carry:
            with torch.no_grad():
                a, e = local_derivatives(*gates, hps, keep)
                new_sens = mingru_carry(state.sens, x, a, e)
        return y, MinGRUState(hs[-1].detach(), new_sens)

    def _outputs(
        self, x: Tensor, h: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
        """The step loop (autograd: BPTT inside the segment). Returns y, h, hp (T, B, N) and
        the gates z, c, g'(pre_h) (T, B, N) each, detached, for the carry."""
        N = self.hidden_size
        pre = torch.nn.functional.linear(
            x, torch.cat([self.W_z, self.W_h]), torch.cat([self.b_z, self.b_h])
        )  # (T, B, 2N)
        z = torch.sigmoid(pre[..., :N])
        c, dc = candidate(pre[..., N:], self.candidate)
        hs, hps = [], []
        # unbind: one backward for all steps (indexing z[t] would zero-fill (T, B, N) per step)
        for z_t, c_t, keep_t in zip(z.unbind(0), c.unbind(0), _steps(keep, x.shape[0])):
            hp = h if keep_t is None else h * keep_t
            h = torch.lerp(hp, c_t, z_t)  # (1 - z) hp + z c
            hs.append(h)
            hps.append(hp)
        h_all = torch.stack(hs)
        y = torch.tanh(h_all) if self.output == "tanh" else h_all
        return y, h_all, torch.stack(hps).detach(), (z.detach(), c.detach(), dc)

    @torch.no_grad()
    def act(
        self, x: Tensor, state: MinGRUState, reset: Tensor | None = None
    ) -> tuple[Tensor, MinGRUState, MinGRUTrace]:
        """y (T, B, N) as `forward` gives it, the light state after the steps, and what the
        carry reads (a, e), so that `carry_traces` re-runs no recurrence."""
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        keep = keep_mask(reset, x.dtype)
        y, hs, hps, gates = self._outputs(x, state.h, keep)
        a, e = local_derivatives(*gates, hps, keep)
        return y, MinGRUState(hs[-1], None), MinGRUTrace(x, a, e, hs[-1])

    @torch.no_grad()
    def carry_traces(
        self, state: MinGRUState, traces: Sequence[MinGRUTrace], out: Any = None
    ) -> MinGRUState:
        """The state after the acted steps, the sensitivities carried from `state`'s over the
        steps' traces (one segment carry); `out` as in `RecurrentCore.carry_traces`."""
        last = traces[-1].last
        if not (self.carries_sensitivities and state.sens is not None):
            return write_state(out, MinGRUState(last, None))
        x, a, e = (torch.cat([getattr(t, k) for t in traces]) for k in ("x", "a", "e"))
        return write_state(out, MinGRUState(last, mingru_carry(state.sens, x, a, e)))


def _steps(keep: Tensor | None, T: int):
    """keep (T, B, 1) per step, or None T times."""
    return keep.unbind(0) if keep is not None else [None] * T


def lecun_normal_(W: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """W (N, D) in place: a normal truncated at +-2 standard deviations, scaled to variance
    1/D (flax's lecun_normal; 0.8796... is the truncated unit normal's standard deviation)."""
    std = math.sqrt(1.0 / W.shape[-1]) / 0.87962566103423978
    return nn.init.trunc_normal_(W, 0.0, std, -2.0 * std, 2.0 * std, generator=generator)
