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

from r2ac.rtrl.core import RecurrentCore, StateTensor
from r2ac.rtrl.state import run_in_reset_chunks

RULES = ("bptt",)


class LSTMState(NamedTuple):
    h: Tensor  # (B, N)
    c: Tensor  # (B, N)


def _fused_lstm(
    x: Tensor, h0: Tensor, c0: Tensor, weights: list[Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """PyTorch's LSTM kernel on x (T, B, D) from (h0, c0) (B, N); returns y (T, B, N), h, c."""
    y, h, c = torch._VF.lstm(x, (h0[None], c0[None]), weights, True, 1, 0.0, True, False, False)
    return y, h[0], c[0]


class LSTM(RecurrentCore):
    """Standard LSTM core, rule "bptt" only. Parameters W_ih (4N, D), W_hh (4N, N), b (4N,).

    Initialisation: W_ih ~ U(+-1/sqrt(D)), W_hh ~ U(+-1/sqrt(N)), b = 0 except the forget
    gate's 1 (as the eLSTM's b_f).
    """

    RULES = RULES
    State = LSTMState

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rule: str = "bptt",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(input_size, hidden_size, rule)
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

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> LSTMState:
        """Zero (h, c); `with_sensitivities` is accepted for a uniform interface (none carried)."""
        self.check_batch_size(batch_size)
        kw = {"device": self.W_ih.device, "dtype": self.W_ih.dtype}
        return LSTMState(
            torch.zeros(batch_size, self.hidden_size, **kw),
            torch.zeros(batch_size, self.hidden_size, **kw),
        )

    def state_tensors(self, state: LSTMState, batch_size: int) -> list[StateTensor]:
        shape = (batch_size, self.hidden_size)
        return [("h", state.h, shape), ("c", state.c, shape)]

    def forward(
        self, x: Tensor, state: LSTMState, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, LSTMState]:
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        weights = [self.W_ih, self.W_hh, self.b, torch.zeros_like(self.b, requires_grad=False)]
        y, (h, c) = run_in_reset_chunks(  # (T, B, N)
            x,
            reset,
            (state.h.detach(), state.c.detach()),
            lambda xc, h, c: _fused_lstm(xc, h, c, weights),
        )
        return y, LSTMState(h.detach(), c.detach())
