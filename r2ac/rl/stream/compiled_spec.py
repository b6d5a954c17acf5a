"""What the compiled streaming step (compiled.py) takes and keeps: its static description
(`StepSpec`, constant per run: the compiler specialises on it), the carried tensors
(`StepState`, `Pending`) and their exchange with a `StreamAC` (`state_of`, `sync_to`); which
agents it covers (`check_supported`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import COMPILED_STEP_CORES
from r2ac.rl.stream.ac import StreamAC
from r2ac.rl.stream.nets import Slot
from r2ac.rtrl import pair_math as pm

# ---------------------------------------------------------------- the static description


@dataclass(frozen=True)
class StepSpec:
    """What the step needs to know that is not a tensor (constant per run: the compiler
    specialises on it)."""

    k: int
    obs_size: int
    actions: int
    cell: str  # "rtu" or "lru"
    rule: str  # "rtrl" or "bptt"
    units: int  # U complex units
    feat: int  # D, the core's input width
    depth: int  # layers below the core
    top: int  # layers above the core
    body: tuple[Slot, ...]  # one body's slots (both bodies alike), offsets in the flat row
    heads: tuple[tuple[Slot, ...], tuple[Slot, ...]]  # actor's, critic's head slots
    p_body: int
    width: int  # P of the (2, K, P) buffers
    discount: float
    trace_lambda: float
    lr: float
    kappa_actor: float
    kappa_critic: float
    entropy_cost: float
    phase_bound: float
    dtype: torch.dtype

    @property
    def vectors(self) -> tuple[str, ...]:
        """The per-unit parameters, in the order of the sensitivities' M axis."""
        if self.cell == "rtu":
            return ("nu_log", "theta_log")
        return ("nu_log", "theta_log", "gamma_log")

    @property
    def maps(self) -> tuple[str, str]:
        return ("W1", "W2") if self.cell == "rtu" else ("B_re", "B_im")


def check_supported(agent: StreamAC) -> None:
    """ConfigError with the reason where the functional step does not cover `agent`."""
    core = agent.body_core.name
    if type(agent) is not StreamAC:
        raise ConfigError(f"compiled stream step: {type(agent).__name__} is not covered")
    if agent.space.kind != "discrete":
        raise ConfigError(
            f"compiled stream step: action space {agent.space.describe()} is not covered "
            "(Discrete only; other spaces run on the eager StreamAC)"
        )
    if core not in COMPILED_STEP_CORES:
        raise ConfigError(
            f"compiled stream step: core {core} is not covered ({', '.join(COMPILED_STEP_CORES)}; "
            "other cores run on the eager StreamAC)"
        )
    if agent.frozen:
        raise ConfigError("compiled stream step: a frozen agent (evaluation) runs eagerly")


def spec_of(agent: StreamAC) -> StepSpec:
    check_supported(agent)
    s, core = agent.settings, agent.body_core
    body = tuple(sl for sl in agent.actor.layout.slots if not _is_head(sl.name))
    heads = tuple(
        tuple(sl for sl in net.layout.slots if _is_head(sl.name))
        for net in (agent.actor, agent.critic)
    )
    return StepSpec(
        k=agent.k,
        obs_size=agent.obs_size,
        actions=agent.space.nvec[0],
        cell=core.name.split("-")[0],
        rule=core.rule,
        units=core.units,
        feat=core.input_size,
        depth=len(agent.actor.mlp),
        top=len(agent.actor.top),
        body=body,
        heads=heads,
        p_body=sum(sl.size for sl in body),
        width=agent.params.flat.shape[2],
        discount=s.discount,
        trace_lambda=s.trace_lambda,
        lr=s.lr,
        kappa_actor=s.kappa_actor,
        kappa_critic=s.kappa_critic,
        entropy_cost=s.entropy_cost,
        phase_bound=pm.phase_log_bound(core.ring[2]),
        dtype=agent.dtype,
    )


def _is_head(name: str) -> bool:
    return name.startswith("head.") or name == "log_std"


# ---------------------------------------------------------------- the carried tensors


class StepState(NamedTuple):
    """All of K agents' state (StreamAC's fields in brackets)."""

    params: torch.Tensor  # (2, K, P) actor's, critic's flat weights [params.flat]
    traces: torch.Tensor  # (2, K, P) [traces.flat]
    core: tuple  # (2K, ...) the cores' state, actor's rows then critic's [state]
    obs_count: torch.Tensor  # (K,) float64 [obs_stats.count]
    obs_mean: torch.Tensor  # (K, O) float64
    obs_p: torch.Tensor  # (K, O) float64
    rew_count: torch.Tensor  # (K,) float64 [rewards.stats]
    rew_mean: torch.Tensor  # (K,) float64
    rew_p: torch.Tensor  # (K,) float64
    ret: torch.Tensor  # (K,) float64, the discounted return so far [rewards.ret]
    x: torch.Tensor  # (K, O) the normalised current observation [x]
    reset: torch.Tensor  # (K,) bool, the core restarts at the next act [reset]
    steps: torch.Tensor  # () int64, the sampler's counter [steps]
    seeds: torch.Tensor  # (K,) int64 holding the uint64 seeds' bits [seeds]


class Pending(NamedTuple):
    """What act keeps for learn (StreamAC._pending)."""

    logits: torch.Tensor  # (K, A)
    action: torch.Tensor  # (K,) int64
    value: torch.Tensor  # (K,) V(s_t)
    h: torch.Tensor  # (2K, 1, H') the heads' input rows
    core: tuple  # (2K, ...) the cores' next state
    mlp: tuple  # per layer below the core: (x, pre, mean, rstd, normed)
    top: tuple  # per layer above the core
    saved: tuple  # the core's: feat (2K, D), lam_re, lam_im, gamma (2K, U), bptt's d s / d v, read


def state_of(agent: StreamAC) -> StepState:
    """StreamAC's state as a StepState (copies: the agent is not changed by the step)."""
    f64 = torch.float64
    st = agent.obs_stats
    return StepState(
        params=agent.params.flat.clone(),
        traces=agent.traces.flat.clone(),
        core=tuple(t.clone() for t in agent.state),
        obs_count=torch.tensor(st.count, dtype=f64),
        obs_mean=torch.tensor(st.mean, dtype=f64),
        obs_p=torch.tensor(st.p, dtype=f64),
        rew_count=torch.tensor(agent.rewards.stats.count, dtype=f64),
        rew_mean=torch.tensor(agent.rewards.stats.mean, dtype=f64),
        rew_p=torch.tensor(agent.rewards.stats.p, dtype=f64),
        ret=torch.tensor(agent.rewards.ret, dtype=f64),
        x=agent.x.clone(),
        reset=agent.reset.clone(),
        steps=torch.tensor(agent.steps, dtype=torch.int64),
        seeds=torch.from_numpy(agent.seeds.astype(np.uint64).view(np.int64).copy()),
    )


@torch.no_grad()
def sync_to(agent: StreamAC, st: StepState) -> None:
    """Write `st` into `agent` (weights, traces, core states, normalisers, counters)."""
    agent.params.flat.copy_(st.params)
    agent.traces.flat.copy_(st.traces)
    agent.state = type(agent.state)(*(t.clone() for t in st.core))
    for arr, t in (
        (agent.obs_stats.count, st.obs_count),
        (agent.obs_stats.mean, st.obs_mean),
        (agent.obs_stats.p, st.obs_p),
        (agent.rewards.stats.count, st.rew_count),
        (agent.rewards.stats.mean, st.rew_mean),
        (agent.rewards.stats.p, st.rew_p),
        (agent.rewards.ret, st.ret),
    ):
        arr[...] = t.numpy()
    agent.x, agent.reset, agent.steps = st.x.clone(), st.reset.clone(), int(st.steps)
    agent._pending = None
