"""The copy task's model: one-hot input -> a recurrent core of r2ac.rtrl -> a readout over {0, 1}.

As in the paper the input goes straight into the core (the eLSTM's output h = o * c already
has the output gate), then a linear readout; `readout_hidden` > 0 puts one ReLU layer in
between, a diagnostic of whether decoding or storage limits the core.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from r2ac.rtrl.elstm.layer import chrono_forget_bias_
from r2ac.rtrl.registry import make_core
from r2ac.tasks.copy.config import DTYPES, CopyConfig
from r2ac.tasks.copy.data import INPUT_SIZE


class CopyModel(nn.Module):
    """One-hot input -> recurrent core (the eLSTM by default) -> Linear(N, 2) over {0, 1}.

    `core` names a family of r2ac.rtrl.registry (elstm, lstm, fwp, felstm, elman); the layer is
    `<core>-<rule>`. The other families are there as diagnostics against the eLSTM.
    `readout_hidden` > 0 makes the readout Linear(N, H) -> ReLU -> Linear(H, 2): it is outside
    the recurrence, so the core's gradient rule (and RTRL's exactness) is unchanged.
    """

    def __init__(
        self,
        hidden_size: int,
        rule: str = "rtrl",
        fused_step: bool = False,
        chrono_span: int | None = None,
        core: str = "elstm",
        readout_hidden: int = 0,
    ):
        super().__init__()
        extra = {"fused_step": True} if fused_step else {}  # an eLSTM option (CopyConfig checks)
        self.core = make_core(f"{core}-{rule}", INPUT_SIZE, hidden_size, **extra)
        self.readout = (
            nn.Sequential(
                nn.Linear(hidden_size, readout_hidden), nn.ReLU(), nn.Linear(readout_hidden, 2)
            )
            if readout_hidden
            else nn.Linear(hidden_size, 2)
        )
        if chrono_span is not None:
            chrono_forget_bias_(self.core, chrono_span)

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None):
        return self.core.initial_state(batch_size, with_sensitivities)

    def forward(self, x: Tensor, state):
        h, state = self.core(x, state)  # (T, B, N)
        return self.readout(h), state  # logits (T, B, 2)


def build_model(cfg: CopyConfig) -> CopyModel:
    """The model of `cfg`, initialised from `cfg.seed` (torch's global generator)."""
    torch.manual_seed(cfg.seed)
    span = max(2 * cfg.length, 3) if cfg.chrono_init else None
    return CopyModel(cfg.hidden, cfg.rule, cfg.fused_step, span, cfg.core, cfg.readout_hidden).to(
        cfg.device, DTYPES[cfg.dtype]
    )


def dtype_of(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first parameter (None without parameters)."""
    first = next(model.parameters(), None)
    return None if first is None else first.dtype
