"""What the compiled streaming step (compiled.py) takes and keeps: its static description
(`StepSpec`, constant per run: the compiler specialises on it), the carried tensors
(`StepState`, `Pending`) and their exchange with a `StreamAC` or a `StreamQRC` (`state_of`,
`sync_to`); which agents it covers (`check_supported`). QRC's step (compiled_qrc.py) carries
the same state (its Q and h networks in the actor's and critic's places, z_q and z_h the two
rows of `traces`) with z_b in `extra`."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import NamedTuple

import numpy as np
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import COMPILED_STEP_CORES
from r2ac.rl.stream.ac import StreamAC
from r2ac.rl.stream.nets import Slot
from r2ac.rl.stream.qrc import StreamQRC
from r2ac.rtrl import pair_math as pm

# QRCSettings' fields the functional QRC step reads; any other one away from its default
# (a setting it would not apply) keeps the agent on the eager StreamQRC
QRC_COVERED = ("discount", "trace_lambda", "lr", "h_lr", "beta", "epsilon_start", "epsilon_end",
               "epsilon_steps")  # fmt: skip

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
    algorithm: str = "ac"  # "ac" (StreamAC) or "qrc" (StreamQRC: the fields below)
    h_lr: float = 0.0
    beta: float = 0.0
    epsilon_start: float = 0.0
    epsilon_end: float = 0.0
    epsilon_steps: int = 1

    @property
    def vectors(self) -> tuple[str, ...]:
        """The per-unit parameters, in the order of the sensitivities' M axis."""
        if self.cell == "rtu":
            return ("nu_log", "theta_log")
        return ("nu_log", "theta_log", "gamma_log")

    @property
    def maps(self) -> tuple[str, str]:
        return ("W1", "W2") if self.cell == "rtu" else ("B_re", "B_im")

    @property
    def phase(self) -> Slot:
        """The slot of the bounded phase, core.theta_log (StreamAC._bounded)."""
        (slot,) = [sl for sl in self.body if sl.name == "core.theta_log"]
        return slot


def check_supported(agent: StreamAC | StreamQRC) -> None:
    """ConfigError with the reason where the functional step does not cover `agent`."""
    core = agent.body_core.name
    if type(agent) not in (StreamAC, StreamQRC):
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
    if isinstance(agent, StreamQRC):
        other = [
            f.name
            for f in fields(agent.settings)
            if f.name not in QRC_COVERED and getattr(agent.settings, f.name) != f.default
        ]
        if other or any(f.default is MISSING for f in fields(agent.settings)):
            raise ConfigError(
                f"compiled stream step: QRC's {', '.join(other) or 'settings'} not covered "
                "(give --no-compile-step)"
            )


def _nets(agent):
    return (
        (agent.q_net, agent.h_net) if isinstance(agent, StreamQRC) else (agent.actor, agent.critic)
    )


def spec_of(agent: StreamAC | StreamQRC) -> StepSpec:
    check_supported(agent)
    s, core = agent.settings, agent.body_core
    first = _nets(agent)[0]
    body = tuple(sl for sl in first.layout.slots if not _is_head(sl.name))
    heads = tuple(tuple(sl for sl in net.layout.slots if _is_head(sl.name)) for net in _nets(agent))
    if isinstance(agent, StreamQRC):
        algorithm = dict(
            algorithm="qrc", kappa_actor=0.0, kappa_critic=0.0, entropy_cost=0.0,
            h_lr=s.h_lr, beta=s.beta, epsilon_start=s.epsilon_start,
            epsilon_end=s.epsilon_end, epsilon_steps=s.epsilon_steps,
        )  # fmt: skip
    else:
        algorithm = dict(
            kappa_actor=s.kappa_actor, kappa_critic=s.kappa_critic, entropy_cost=s.entropy_cost
        )
    return StepSpec(
        k=agent.k,
        obs_size=agent.obs_size,
        actions=agent.space.nvec[0],
        cell=core.name.split("-")[0],
        rule=core.rule,
        units=core.units,
        feat=core.input_size,
        depth=len(first.mlp),
        top=len(first.top),
        body=body,
        heads=heads,
        p_body=sum(sl.size for sl in body),
        width=agent.params.flat.shape[2],
        discount=s.discount,
        trace_lambda=s.trace_lambda,
        lr=s.lr,
        phase_bound=pm.phase_log_bound(core.ring[2]),
        dtype=agent.dtype,
        **algorithm,
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
    extra: tuple = ()  # QRC: (z_b (K,), the trace of h's values [traces.z_b]); AC: ()


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


def _traces(agent) -> torch.Tensor:
    return agent.traces_flat.flat if isinstance(agent, StreamQRC) else agent.traces.flat


def state_of(agent: StreamAC | StreamQRC) -> StepState:
    """The agent's state as a StepState (copies: the agent is not changed by the step)."""
    f64 = torch.float64
    st = agent.obs_stats
    return StepState(
        params=agent.params.flat.clone(),
        traces=_traces(agent).clone(),
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
        extra=(agent.traces.z_b.clone(),) if isinstance(agent, StreamQRC) else (),
    )


@torch.no_grad()
def sync_to(agent: StreamAC | StreamQRC, st: StepState) -> None:
    """Write `st` into `agent` (weights, traces, core states, normalisers, counters)."""
    agent.params.flat.copy_(st.params)
    _traces(agent).copy_(st.traces)
    if isinstance(agent, StreamQRC):
        agent.traces.z_b.copy_(st.extra[0])
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
