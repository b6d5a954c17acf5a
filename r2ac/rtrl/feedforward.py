"""The memoryless core: a Linear + ReLU per step under the core contract.

Registered as `feedforward` (r2ac.rtrl.registry): the baseline every memory task is
measured against (what an agent scores without memory).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from r2ac.rtrl.core import RecurrentCore


class FeedforwardState(NamedTuple):
    """The empty state of the memoryless core."""


class Feedforward(RecurrentCore):
    """A memoryless core (Linear + ReLU per step) under the core contract (RecurrentCore).

    ``initial_state(B)`` is empty; ``forward(x (T, B, D), state, reset)`` returns
    ``(y (T, B, hidden_size), state)``; ``reset`` is checked and has nothing to reset.
    """

    State = FeedforwardState

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(input_size, hidden_size, rule="bptt")
        self.linear = nn.Linear(input_size, hidden_size, device=device, dtype=dtype)

    def initial_state(
        self, batch_size: int, with_sensitivities: bool | None = None
    ) -> FeedforwardState:
        self.check_batch_size(batch_size)
        return FeedforwardState()

    def forward(
        self,
        x: torch.Tensor,
        state: FeedforwardState,
        reset: torch.Tensor | None = None,
        carry: bool = True,
    ) -> tuple[torch.Tensor, FeedforwardState]:
        self.check_input(x, reset)  # the state holds nothing, so it is not checked
        return torch.relu(self.linear(x)), state  # (T, B, hidden_size)
