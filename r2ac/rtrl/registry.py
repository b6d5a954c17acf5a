"""Cores by name, so that configs and the agent can say `elstm-rtrl` or `lstm-bptt`.

A name is `<core>-<rule>` (or `feedforward`, the memoryless baseline); `make_core(name, input_size, hidden_size)` returns a
`RecurrentCore` (r2ac/rtrl/core.py). Every entry here is tested by tests/rtrl/test_contract.py.
"""

from __future__ import annotations

from typing import NamedTuple

from r2ac.errors import ConfigError
from r2ac.rtrl.core import RecurrentCore
from r2ac.rtrl.elman import Elman
from r2ac.rtrl.elstm.layer import ELSTM
from r2ac.rtrl.feedforward import Feedforward
from r2ac.rtrl.felstm import FeLSTM
from r2ac.rtrl.fwp import FWP
from r2ac.rtrl.gru import GRU
from r2ac.rtrl.lru import LRU
from r2ac.rtrl.lstm import LSTM
from r2ac.rtrl.mingru import MinGRU
from r2ac.rtrl.rtu import RTU


class CoreSpec(NamedTuple):
    """A registry row: the class, the rule it is built with (None: it has one) and a line."""

    cls: type[RecurrentCore]
    rule: str | None
    description: str

    def build(self, input_size: int, hidden_size: int, **kwargs) -> RecurrentCore:
        if self.rule is None:
            return self.cls(input_size, hidden_size, **kwargs)
        return self.cls(input_size, hidden_size, self.rule, **kwargs)


# name -> the class, its rule and a one-line description
CORES: dict[str, CoreSpec] = {
    name: CoreSpec(cls, rule, description)
    for name, cls, rule, description in [
        ("elstm-rtrl", ELSTM, "rtrl", "eLSTM, exact RTRL (untruncated)"),
        ("elstm-bptt", ELSTM, "bptt", "eLSTM, BPTT truncated at segment starts"),
        ("elstm-snap1", ELSTM, "snap1", "eLSTM, SnAp-1 (= exact RTRL: diagonal recurrence)"),
        ("felstm-bptt", FeLSTM, "bptt", "feLSTM (full W_f, W_z), truncated BPTT"),
        ("felstm-snap1", FeLSTM, "snap1", "feLSTM, BPTT in segments + SnAp-1 across them (approximate)"),
        ("lstm-bptt", LSTM, "bptt", "standard LSTM, truncated BPTT"),
        ("gru-bptt", GRU, "bptt", "GRU, truncated BPTT"),
        ("fwp-rtrl", FWP, "rtrl", "fast weight programmer, exact RTRL"),
        ("fwp-bptt", FWP, "bptt", "fast weight programmer, truncated BPTT"),
        ("elman-rtrl", Elman, "rtrl", "Elman RNN, full RTRL (hybrid per segment), O(N^4)"),
        ("elman-bptt", Elman, "bptt", "Elman RNN, truncated BPTT"),
        ("rtu-rtrl", RTU, "rtrl", "linear RTU (n/2 trace units, tanh output), exact RTRL"),
        ("rtu-bptt", RTU, "bptt", "linear RTU, truncated BPTT"),
        ("lru-rtrl", LRU, "rtrl", "linear recurrent unit (complex diagonal), exact RTRL"),
        ("lru-bptt", LRU, "bptt", "linear recurrent unit, truncated BPTT"),
        ("mingru-rtrl", MinGRU, "rtrl", "minGRU (gate and candidate from the input only), exact RTRL"),
        ("mingru-bptt", MinGRU, "bptt", "minGRU, truncated BPTT"),
        ("feedforward", Feedforward, None, "memoryless: Linear + ReLU per step (the baseline)"),
    ]
}  # fmt: skip


def core_names(include_memoryless: bool = False) -> list[str]:
    """The recurrent cores' names, sorted; with `include_memoryless`, `feedforward` too."""
    return sorted(n for n, spec in CORES.items() if include_memoryless or spec.rule is not None)


def make_core(name: str, input_size: int, hidden_size: int, **kwargs) -> RecurrentCore:
    """Build the core called `name` (see `core_names()`); unknown names raise ConfigError."""
    if name not in CORES:
        raise ConfigError(f"unknown core {name!r}; choose one of {', '.join(core_names(True))}")
    if input_size < 1 or hidden_size < 1:
        raise ConfigError(
            f"core sizes must be positive, got input {input_size}, hidden {hidden_size}"
        )
    return CORES[name].build(input_size, hidden_size, **kwargs)
