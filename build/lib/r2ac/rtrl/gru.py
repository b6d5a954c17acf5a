"""The GRU (Cho et al. 2014, PyTorch's form) trained by BPTT truncated at segment starts:
the baseline POPGym's users know best.

    [r, z, n]_x = W_ih x(t) + b_ih,   [r, z, n]_h = W_hh hp(t) + b_hh    gates stacked (r, z, n)
    r = sigmoid(r_x + r_h),  z = sigmoid(z_x + z_h),  n = tanh(n_x + r * n_h)
    h(t) = (1 - z) * n + z * hp(t)                     hp: h(t-1), zeroed on reset

The segment runs on PyTorch's fused GRU kernel (the one nn.GRU uses), split into chunks at
the steps where some stream restarts, exactly like r2ac.rtrl.lstm. With a segment as long as
the episode it is full BPTT, the reference exact RTRL should match at short M.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.rtrl.core import RecurrentCore, StateTensor
from r2ac.rtrl.state import run_in_reset_chunks

RULES = ("bptt",)


class GRUState(NamedTuple):
    h: Tensor  # (B, N)


def _fused_gru(x: Tensor, h0: Tensor, weights: list[Tensor]) -> tuple[Tensor, Tensor]:
    """PyTorch's GRU kernel on x (T, B, D) from h0 (B, N); returns y (T, B, N) and h (B, N)."""
    y, h = torch._VF.gru(x, h0[None], weights, True, 1, 0.0, True, False, False)
    return y, h[0]


class GRU(RecurrentCore):
    """GRU core, rule "bptt" only. Parameters W_ih (3N, D), W_hh (3N, N), b_ih, b_hh (3N,).

    Initialisation as nn.GRU: every parameter ~ U(+-1/sqrt(N)).
    """

    RULES = RULES
    State = GRUState

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
        self.W_ih = nn.Parameter(torch.empty(3 * N, D, **kw))
        self.W_hh = nn.Parameter(torch.empty(3 * N, N, **kw))
        self.b_ih = nn.Parameter(torch.empty(3 * N, **kw))
        self.b_hh = nn.Parameter(torch.empty(3 * N, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            p.uniform_(-bound, bound)

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> GRUState:
        """Zero h; `with_sensitivities` is accepted for a uniform interface (none carried)."""
        self.check_batch_size(batch_size)
        kw = {"device": self.W_ih.device, "dtype": self.W_ih.dtype}
        return GRUState(torch.zeros(batch_size, self.hidden_size, **kw))

    def state_tensors(self, state: GRUState, batch_size: int) -> list[StateTensor]:
        return [("h", state.h, (batch_size, self.hidden_size))]

    def forward(
        self, x: Tensor, state: GRUState, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, GRUState]:
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        weights = [self.W_ih, self.W_hh, self.b_ih, self.b_hh]
        y, (h,) = run_in_reset_chunks(  # (T, B, N)
            x, reset, (state.h.detach(),), lambda xc, h: _fused_gru(xc, h, weights)
        )
        return y, GRUState(h.detach())
