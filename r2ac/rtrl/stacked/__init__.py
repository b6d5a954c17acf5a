"""Stacked cores: K independent agents' recurrent cores advanced one step at a time as one
batched computation, each agent with its own weights, exact RTRL carried per agent.

For the streaming agent (batch 1 per agent, an update every step). Interface:

    core = make_stacked_core(name, num_agents=K, input_size=D, hidden_size=N, dtype=torch.float32)
    params = core.init_params(generator)   # or a list of K generators; name -> (K, ...) tensors
    state = core.initial_state()           # a NamedTuple of (K, ...) tensors (checkpointable)
    h, state = core.step(params, x, state, reset)   # x (K, D), reset (K,) bool -> h (K, output_size)
    h = core.peek(params, x, state, reset)          # no grad, no sensitivity update
    core.sensitivity_numbers()                      # per agent

Names (`STACKED_CORES`): rtu-rtrl, rtu-bptt, lru-rtrl, lru-bptt, elstm-rtrl, elstm-bptt,
mingru-rtrl, mingru-bptt, gru-bptt, feedforward. "-bptt" is TBPTT(1): the gradient stops at
the previous state.
Every core keeps the parameterisation, the parameter names and shapes (per agent) and the
initialisation of the batched module of the same name (r2ac.rtrl.registry): with K = 1 and
the same weights, step() gives that module's outputs (tests/rtrl/test_stacked.py). The
feedforward core's `weight`, `bias` are the module's `linear.weight`, `linear.bias`
(`MODULE_NAMES`). hidden_size is counted as r2ac counts it: for the RTU, N = 2 x units
(output [c1; c2], (K, N)); for the LRU, N outputs and N complex state units.

Gradients (rule rtrl): autograd of a scalar L(h_t) w.r.t. params gives, per agent, the exact
dL/dh_t . dh_t/dtheta through that agent's whole stream since its last reset (sensitivities
carried from earlier steps were computed at those steps' weights: exact when weights are
fixed); w.r.t. x, this step's only. Each step is one autograd.Function whose forward runs the
recurrence and the closed-form sensitivity carry (element-wise, or complex per unit for
RTU/LRU) and whose backward contracts dL/dc(t) with the new sensitivities S(t); the read-out
(tanh, output gate, C s + D x) is ordinary autograd. The math: pair.py (RTU, LRU), elstm.py,
mingru.py, simple.py (GRU, feedforward). r2ac.rtrl.stacked.bench.bench_stacked times a step +
backward.
"""

from __future__ import annotations

import torch

from r2ac.errors import ConfigError
from r2ac.rtrl.stacked.base import (
    ELSTMRTRLState,
    EmptyState,
    HiddenState,
    MinGRURTRLState,
    PairRTRLState,
    StackedCore,
)
from r2ac.rtrl.stacked.elstm import StackedELSTM
from r2ac.rtrl.stacked.mingru import StackedMinGRU
from r2ac.rtrl.stacked.pair import StackedLRU, StackedRTU
from r2ac.rtrl.stacked.simple import StackedFeedforward, StackedGRU

# name -> (class, rule)
STACKED_CORES: dict[str, tuple[type[StackedCore], str]] = {
    "rtu-rtrl": (StackedRTU, "rtrl"),
    "rtu-bptt": (StackedRTU, "bptt"),
    "lru-rtrl": (StackedLRU, "rtrl"),
    "lru-bptt": (StackedLRU, "bptt"),
    "elstm-rtrl": (StackedELSTM, "rtrl"),
    "elstm-bptt": (StackedELSTM, "bptt"),
    "mingru-rtrl": (StackedMinGRU, "rtrl"),
    "mingru-bptt": (StackedMinGRU, "bptt"),
    "gru-bptt": (StackedGRU, "bptt"),
    "feedforward": (StackedFeedforward, "none"),
}

# stacked parameter name -> the batched module's state_dict key, where they differ
MODULE_NAMES: dict[str, dict[str, str]] = {
    "feedforward": {"weight": "linear.weight", "bias": "linear.bias"},
}


def stacked_core_names() -> list[str]:
    return list(STACKED_CORES)


def make_stacked_core(
    name: str,
    num_agents: int = 1,
    input_size: int = 1,
    hidden_size: int = 64,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> StackedCore:
    """The stacked core called `name`; unknown names and bad sizes raise a one-line ConfigError."""
    if name not in STACKED_CORES:
        raise ConfigError(
            f"unknown streaming core {name!r}; choose one of {', '.join(STACKED_CORES)}"
        )
    for what, v in (("num_agents", num_agents), ("input_size", input_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}: {what} must be a positive integer, got {v!r}")
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
        raise ConfigError(f"{name}: hidden_size must be a positive integer, got {hidden_size!r}")
    if name.startswith("rtu") and hidden_size % 2:
        raise ConfigError(
            f"{name}: hidden_size is 2 x units (c1 and c2 concatenated), must be even, got {hidden_size}"
        )
    if dtype not in (torch.float32, torch.float64):
        raise ConfigError(f"{name}: dtype must be torch.float32 or torch.float64, got {dtype}")
    cls, rule = STACKED_CORES[name]
    return cls(name, rule, num_agents, input_size, hidden_size, dtype, device)


def params_from_modules(core: StackedCore, modules) -> dict[str, torch.Tensor]:
    """Stack the weights of K batched modules (r2ac.rtrl.registry.make_core of the same name
    and sizes) into the stacked core's params: name -> (K, ...), detached copies."""
    if len(modules) != core.num_agents:
        raise ConfigError(f"{core.name}: got {len(modules)} modules for {core.num_agents} agents")
    rename = MODULE_NAMES.get(core.name, {})
    dicts = [m.state_dict() for m in modules]
    return {
        n: torch.stack([d[rename.get(n, n)].detach() for d in dicts]).clone()
        for n in core.param_shapes()
    }


__all__ = [
    "ELSTMRTRLState",
    "EmptyState",
    "HiddenState",
    "MODULE_NAMES",
    "MinGRURTRLState",
    "PairRTRLState",
    "STACKED_CORES",
    "StackedCore",
    "make_stacked_core",
    "params_from_modules",
    "stacked_core_names",
]
