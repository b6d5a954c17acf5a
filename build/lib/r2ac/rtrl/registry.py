"""Cores by name, so that configs and the agent can say `elstm-rtrl` or `lstm-bptt`.

A name is `<core>-<rule>`; `make_core(name, input_size, hidden_size)` returns a
`RecurrentCore` (r2ac/rtrl/core.py). Every entry here is tested by tests/rtrl/test_contract.py.
"""

from __future__ import annotations

from collections.abc import Callable

from r2ac.errors import ConfigError
from r2ac.rtrl.core import RecurrentCore
from r2ac.rtrl.elman import Elman
from r2ac.rtrl.elstm import ELSTM
from r2ac.rtrl.felstm import FeLSTM
from r2ac.rtrl.fwp import FWP
from r2ac.rtrl.gru import GRU
from r2ac.rtrl.lru import LRU
from r2ac.rtrl.lstm import LSTM
from r2ac.rtrl.rtu import RTU

CoreFactory = Callable[..., RecurrentCore]

# name -> (factory(input_size, hidden_size, **kw), one-line description)
CORES: dict[str, tuple[CoreFactory, str]] = {
    "elstm-rtrl": (lambda d, n, **kw: ELSTM(d, n, "rtrl", **kw), "eLSTM, exact RTRL (untruncated)"),
    "elstm-bptt": (
        lambda d, n, **kw: ELSTM(d, n, "bptt", **kw),
        "eLSTM, BPTT truncated at segment starts",
    ),
    "elstm-snap1": (
        lambda d, n, **kw: ELSTM(d, n, "snap1", **kw),
        "eLSTM, SnAp-1 (= exact RTRL: diagonal recurrence)",
    ),
    "felstm-bptt": (
        lambda d, n, **kw: FeLSTM(d, n, "bptt", **kw),
        "feLSTM (full W_f, W_z), truncated BPTT",
    ),
    "felstm-snap1": (
        lambda d, n, **kw: FeLSTM(d, n, "snap1", **kw),
        "feLSTM, BPTT in segments + SnAp-1 across them (approximate)",
    ),
    "lstm-bptt": (lambda d, n, **kw: LSTM(d, n, "bptt", **kw), "standard LSTM, truncated BPTT"),
    "gru-bptt": (lambda d, n, **kw: GRU(d, n, "bptt", **kw), "GRU, truncated BPTT"),
    "fwp-rtrl": (lambda d, n, **kw: FWP(d, n, "rtrl", **kw), "fast weight programmer, exact RTRL"),
    "fwp-bptt": (
        lambda d, n, **kw: FWP(d, n, "bptt", **kw),
        "fast weight programmer, truncated BPTT",
    ),
    "elman-rtrl": (
        lambda d, n, **kw: Elman(d, n, "rtrl", **kw),
        "Elman RNN, full RTRL (hybrid per segment), O(N^4)",
    ),
    "elman-bptt": (lambda d, n, **kw: Elman(d, n, "bptt", **kw), "Elman RNN, truncated BPTT"),
    "rtu-rtrl": (
        lambda d, n, **kw: RTU(d, n, "rtrl", **kw),
        "linear RTU (n/2 trace units, tanh output), exact RTRL",
    ),
    "rtu-bptt": (lambda d, n, **kw: RTU(d, n, "bptt", **kw), "linear RTU, truncated BPTT"),
    "lru-rtrl": (
        lambda d, n, **kw: LRU(d, n, "rtrl", **kw),
        "linear recurrent unit (complex diagonal), exact RTRL",
    ),
    "lru-bptt": (
        lambda d, n, **kw: LRU(d, n, "bptt", **kw),
        "linear recurrent unit, truncated BPTT",
    ),
}


def core_names() -> list[str]:
    return sorted(CORES)


def make_core(name: str, input_size: int, hidden_size: int, **kwargs) -> RecurrentCore:
    """Build the core called `name` (see `core_names()`); unknown names raise ConfigError."""
    if name not in CORES:
        raise ConfigError(f"unknown core {name!r}; choose one of {', '.join(core_names())}")
    if input_size < 1 or hidden_size < 1:
        raise ConfigError(
            f"core sizes must be positive, got input {input_size}, hidden {hidden_size}"
        )
    return CORES[name][0](input_size, hidden_size, **kwargs)
