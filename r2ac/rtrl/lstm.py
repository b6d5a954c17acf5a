"""The standard, fully recurrent LSTM trained by BPTT truncated at segment starts (baseline).

    [i, f, g, o](t) = W_ih x(t) + W_hh hp(t) + b         gates stacked in PyTorch's order
    c(t) = sigmoid(f) cp(t) + sigmoid(i) tanh(g)          hp, cp: h(t-1), c(t-1) zeroed on reset
    h(t) = sigmoid(o) tanh(c(t))

The segment runs on PyTorch's fused LSTM kernel (the one nn.LSTM uses), split into chunks at
the steps where some stream restarts; between chunks the restarting streams' (h, c) are
zeroed. Gradients are exact BPTT inside the segment; the state is detached at its start.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.rtrl.state import check_rule, check_segment, check_state_tensor

RULES = ("bptt",)


class LSTMState(NamedTuple):
    h: Tensor  # (B, N)
    c: Tensor  # (B, N)


def _fused_lstm(x: Tensor, h0: Tensor, c0: Tensor, weights: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """PyTorch's LSTM kernel on x (T, B, D) from (h0, c0) (B, N); returns y (T, B, N), h, c."""
    y, h, c = torch._VF.lstm(x, (h0[None], c0[None]), weights, True, 1, 0.0, True, False, False)
    return y, h[0], c[0]


class LSTM(nn.Module):
    """Standard LSTM core, rule "bptt" only. Parameters W_ih (4N, D), W_hh (4N, N), b (4N,).

    Initialisation: W_ih ~ U(+-1/sqrt(D)), W_hh ~ U(+-1/sqrt(N)), b = 0 except the forget
    gate's 1 (as the eLSTM's b_f).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "bptt",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if input_size < 1 or hidden_size < 1:
            raise ValueError(f"LSTM: sizes must be positive, got D={input_size}, N={hidden_size}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.rule = check_rule(rule, RULES, "LSTM")
        N, D = hidden_size, input_size
        kw = {"device": device, "dtype": dtype}
        self.W_ih = nn.Parameter(torch.empty(4 * N, D, **kw))
        self.W_hh = nn.Parameter(torch.empty(4 * N, N, **kw))
        self.b = nn.Parameter(torch.empty(4 * N, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        N = self.hidden_size
        self.W_ih.uniform_(-1 / math.sqrt(self.input_size), 1 / math.sqrt(self.input_size))
        self.W_hh.uniform_(-1 / math.sqrt(N), 1 / math.sqrt(N))
        self.b.zero_()
        self.b[N : 2 * N] = 1.0

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, rule={self.rule!r}"

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> LSTMState:
        """Zero (h, c); `with_sensitivities` is accepted for a uniform interface (none carried)."""
        if batch_size < 1:
            raise ValueError(f"LSTM: batch_size must be >= 1, got {batch_size}")
        kw = {"device": self.W_ih.device, "dtype": self.W_ih.dtype}
        return LSTMState(torch.zeros(batch_size, self.hidden_size, **kw), torch.zeros(batch_size, self.hidden_size, **kw))

    def forward(
        self, x: Tensor, state: LSTMState, reset: Tensor | None = None
    ) -> tuple[Tensor, LSTMState]:
        T, B = check_segment(x, reset, self.input_size, self.W_ih, "LSTM")
        if not isinstance(state, LSTMState):
            raise TypeError(f"LSTM: state must be an LSTMState, got {type(state).__name__}")
        for name in ("h", "c"):
            check_state_tensor(name, getattr(state, name), (B, self.hidden_size), self.W_ih, "LSTM")
        weights = [self.W_ih, self.W_hh, self.b, torch.zeros_like(self.b, requires_grad=False)]
        h, c = state.h.detach(), state.c.detach()
        # chunk boundaries: the segment start and every step where some stream restarts
        starts = [0] if reset is None else sorted({0, *torch.nonzero(reset.any(1)).flatten().tolist()})
        ys = []
        for start, end in zip(starts, starts[1:] + [T]):
            if reset is not None:
                keep = (~reset[start]).to(x.dtype)[:, None]  # (B, 1)
                h, c = h * keep, c * keep
            y, h, c = _fused_lstm(x[start:end], h, c, weights)
            ys.append(y)
        y = ys[0] if len(ys) == 1 else torch.cat(ys)  # (T, B, N)
        return y, LSTMState(h.detach(), c.detach())
