"""Cores by name, so that configs and the agent can say `elstm-rtrl` or `lstm-bptt`.

A name is `<core>-<rule>`; `make_core(name, input_size, hidden_size)` returns a module that
obeys the core contract (`initial_state`, `forward(x, state, reset)`), with `input_size` and
`hidden_size` attributes.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from r2ac.errors import ConfigError
from r2ac.rtrl.elstm import ELSTM

CoreFactory = Callable[..., nn.Module]

# name -> (factory(input_size, hidden_size, **kw), one-line description)
CORES: dict[str, tuple[CoreFactory, str]] = {
    "elstm-rtrl": (lambda d, n, **kw: ELSTM(d, n, "rtrl", **kw), "eLSTM, exact RTRL (untruncated)"),
    "elstm-bptt": (lambda d, n, **kw: ELSTM(d, n, "bptt", **kw), "eLSTM, BPTT truncated at segment starts"),
}


def core_names() -> list[str]:
    return sorted(CORES)


def make_core(name: str, input_size: int, hidden_size: int, **kwargs) -> nn.Module:
    """Build the core called `name` (see `core_names()`); unknown names raise ConfigError."""
    if name not in CORES:
        raise ConfigError(f"unknown core {name!r}; choose one of {', '.join(core_names())}")
    if input_size < 1 or hidden_size < 1:
        raise ConfigError(f"core sizes must be positive, got input {input_size}, hidden {hidden_size}")
    return CORES[name][0](input_size, hidden_size, **kwargs)
