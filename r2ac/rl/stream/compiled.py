"""Stream AC(lambda)'s step as one pure function of tensors, compiled (`FusedStreamAC`).

`StreamAC.act()` then `StreamAC.learn()` (r2ac/rl/stream/ac.py), written as functions of
tensors in and tensors out with no Python branching on data, no numpy and no host sync, so
that `torch.compile(fullgraph=True)` makes the whole step one graph:

    action, pending = act(spec, state)                       # the first action only
    state, pending, action, info = step(spec, state, pending, reward, obs, final_obs,
                                        terminated, truncated)  # learn, then the next act

`step` is `learn` (the update from the transition the env just returned) followed by `act`
on the new observation: one call per env step. `pending` carries what act keeps for learn
(StreamAC._pending; compiled_spec.py). The math (compiled_math.py) is StreamAC's, operation for operation where it can be: the
observation normaliser and the reward scaler in float64 (RunningStats' and RewardScale's
arithmetic), the counter-hash sampler (uniforms_torch: bit for bit the numpy draw), the
layers (mlp_forward, head_forward, categorical_grads), the TD error with V(s') from the
pre-update weights, traces, ObGD, the phase clamp, the traces' reset at an episode's end.
The RTU / LRU cores are written here in real arithmetic on (re, im) planes (the stacked cores
use complex tensors and a stride test, which the compiler does not take); their math is
r2ac/rtrl/stacked/pair.py's (exact RTRL and TBPTT(1)).

V(s') stays a pass of its own (`peek_value`: the critic's layers on s', its core from the
step's new state, lam and gamma reused): the TD error needs V at the pre-update weights
theta_t, and the next act's forward runs at theta_{t+1} = theta_t + c delta_t z_t, which
depends on delta_t and so on that very V(s'); and after a truncation s' is the episode's
final observation, not the next act's input. No algebra shares it with either forward (the
value is not linear in the weights), short of changing the algorithm (V(s') from the updated
weights). In the compiled step it is a few kernels of the one graph, not a call of its own.

Covered: a Discrete action space; cores rtu-rtrl, rtu-bptt, lru-rtrl, lru-bptt; any layers
below and above the core. Anything else stays on the eager StreamAC (`check_supported`).
QRC(lambda) (StreamQRC) runs the same way, its act and learn from compiled_qrc.py
(`functions`).

`FusedStreamAC` wraps a StreamAC's (or a StreamQRC's) state in this form behind StreamAC's act() / learn()
interface (compiled or not) and writes the state back (`sync_to`).
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import torch
from torch._dynamo.eval_frame import DynamoStance, _set_stance
from torch.utils._pytree import tree_flatten, tree_unflatten

from r2ac.rl.stream import compiled_math, compiled_qrc
from r2ac.rl.stream.ac import StepInfo, StreamAC
from r2ac.rl.stream.compiled_spec import (
    Pending,
    StepSpec,
    StepState,
    spec_of,
    state_of,
    sync_to,
)
from r2ac.rl.stream.qrc import QStepInfo

# ---------------------------------------------------------------- packed: a few buffers in place
# A compiled call's cost grows with the tensors it takes and gives (~1.5 us each on a 2-core
# x86 CPU, ~30 us for one): the state and the pending intermediates travel as a few buffers
# updated in place, and the env's results as one (K, 3 + 2 O) float64 array.
STORED_AS = {torch.bool: torch.int64}


def functions(spec: StepSpec):
    """The algorithm's step functions: its module (act, learn) and its info type."""
    if spec.algorithm == "qrc":
        return compiled_qrc, QStepInfo
    return compiled_math, StepInfo


# leaves at least this big travel as their own buffer: inductor writes a cat of many inputs as
# one masked select per element over all of them (its cost: elements x inputs), so the weights,
# traces and sensitivities are never concatenated; only the small rest is
OWN_BUFFER = 4096


class Packing:
    """Where each tensor of a tree of tensors (here (StepState, Pending)) lives: the large
    ones (>= OWN_BUFFER elements) as buffers of their own, the rest in one flat buffer per
    storage dtype (bool kept as int64). Buffers: the own ones in tree order, then the flat."""

    def __init__(self, tree):
        leaves, self.treedef = tree_flatten(tree)
        # per leaf: (own buffer index or -1, storage dtype, offset, shape, dtype)
        self.fields: list[tuple[int, torch.dtype, int, tuple[int, ...], torch.dtype]] = []
        sizes: dict[torch.dtype, int] = {}
        own = 0
        for t in leaves:
            store = STORED_AS.get(t.dtype, t.dtype)
            if t.numel() >= OWN_BUFFER and store == t.dtype:
                self.fields.append((own, store, 0, tuple(t.shape), t.dtype))
                own += 1
                continue
            offset = sizes.get(store, 0)
            self.fields.append((-1, store, offset, tuple(t.shape), t.dtype))
            sizes[store] = offset + t.numel()
        self.own = own
        self.stores = tuple(sizes)  # the flat buffers' dtypes, in order

    def pack(self, tree) -> tuple[torch.Tensor, ...]:
        """The buffers holding `tree`'s tensors (the own ones as they are)."""
        leaves, _ = tree_flatten(tree)
        own: list[torch.Tensor] = []
        parts: dict[torch.dtype, list] = {d: [] for d in self.stores}
        for (index, store, _, _, _), t in zip(self.fields, leaves, strict=True):
            if index >= 0:
                own.append(t)
            else:
                parts[store].append(t.reshape(-1).to(store))
        return (*own, *(torch.cat(parts[d]) for d in self.stores))

    def unpack(self, buffers):
        """The tree as views of `buffers` (bool fields as fresh bool tensors)."""
        by_dtype = dict(zip(self.stores, buffers[self.own :], strict=True))
        leaves = []
        for index, store, offset, shape, dtype in self.fields:
            if index >= 0:
                leaves.append(buffers[index])
                continue
            t = by_dtype[store][offset : offset + math.prod(shape)].view(shape)
            leaves.append(t != 0 if dtype == torch.bool else t)
        return tree_unflatten(leaves, self.treedef)


def env_array(reward, obs, final_obs, terminated, truncated, k: int) -> np.ndarray:
    """The env's results as one (K, 3 + 2 O) float64 array: reward, terminated, truncated,
    obs, final_obs (float32 observations and rewards exactly)."""
    obs = np.asarray(obs).reshape(k, -1)
    o = obs.shape[1]
    out = np.empty((k, 3 + 2 * o))
    out[:, 0] = np.asarray(reward).reshape(k)
    out[:, 1] = np.asarray(terminated).reshape(k)
    out[:, 2] = np.asarray(truncated).reshape(k)
    out[:, 3 : 3 + o] = obs
    out[:, 3 + o :] = np.asarray(final_obs).reshape(k, o)
    return out


# The cores' state travels apart, in two sets of buffers used in turn: the step reads the
# pending one (the state after step t, which learn needs and which becomes StreamAC's state)
# and writes the next act's into the other (the state before step t, no longer needed), so
# no step copies the sensitivities from one buffer to another.


def _without_core(st: StepState, pend: Pending):
    return st._replace(core=()), pend._replace(core=())


def packed_act(spec: StepSpec, packing: Packing, n: int, *buffers) -> torch.Tensor:
    """act on the packed state: buffers = (the state's core (n), the pending core (n), the
    packed rest); writes the pending core and intermediates, returns the actions (K,)."""
    core, pend_core, rest = buffers[:n], buffers[n : 2 * n], buffers[2 * n :]
    st, _ = packing.unpack(rest)
    action, pend = functions(spec)[0].act(spec, st._replace(core=core))
    for buf, new in zip(pend_core, pend.core, strict=True):
        buf.copy_(new)
    for buf, new in zip(rest, packing.pack(_without_core(st, pend)), strict=True):
        buf.copy_(new)
    return action


def packed_step(spec: StepSpec, packing: Packing, n: int, env: torch.Tensor, *buffers):
    """step on the packed state, in place: buffers = (the pending core (n), the free core
    (n), the packed rest); the next act's core goes into the free one. Returns the next
    actions (K,) and StepInfo's fields stacked (5, K). env: env_array's (K, 3 + 2 O)."""
    pend_core, free, rest = buffers[:n], buffers[n : 2 * n], buffers[2 * n :]
    st, pend = packing.unpack(rest)
    pend = pend._replace(core=tuple(pend_core))
    o = spec.obs_size
    reward, terminated, truncated = env[:, 0], env[:, 1] != 0, env[:, 2] != 0
    obs, final_obs = env[:, 3 : 3 + o], env[:, 3 + o :]
    fns = functions(spec)[0]  # learn from the transition just taken, then act on the new obs
    st, info = fns.learn(spec, st, pend, reward, obs, final_obs, terminated, truncated)
    action, pend = fns.act(spec, st)
    info = torch.stack(list(info))  # before the buffers it reads (the pending value) change
    for buf, new in zip(free, pend.core, strict=True):
        buf.copy_(new)
    for buf, new in zip(rest, packing.pack(_without_core(st, pend)), strict=True):
        buf.copy_(new)
    return action, info


# ---------------------------------------------------------------- compilation


# inductor's options for a small CPU graph called once a step: the wrapper that allocates
# and launches in C++ (the Python one costs ~2x the kernels), the intermediates planned into
# one allocation, no per-call shape / alignment asserts (the shapes are fixed by the spec)
INDUCTOR_OPTIONS = {
    "cpp_wrapper": True,
    "memory_planning": True,
    "size_asserts": False,
    "alignment_asserts": False,
    "scalar_asserts": False,
}


def compile_options(mode: str | None = None, **overrides) -> dict:
    """torch.compile's arguments for the step: one graph, static shapes; `mode` (e.g.
    "max-autotune-no-cudagraphs") instead of INDUCTOR_OPTIONS; `overrides` of those."""
    out = {"fullgraph": True, "dynamic": False}
    if mode:
        out["mode"] = mode
    else:
        out["options"] = {**INDUCTOR_OPTIONS, **overrides}
    return out


# torch.compiler.set_stance(skip_guard_eval_unsafe=True) as a context costs ~50 us a call
# (it builds its objects each time); its two underlying calls cost ~1 us
_SKIP_GUARDS = DynamoStance("default", skip_guard_eval_unsafe=True)


@contextlib.contextmanager
def skip_guards(active: bool = True):
    """Compiled functions called inside run without dynamo's guard checks (callers whose
    inputs always have the shapes the graph was compiled for: nothing to guard; the checks
    cost as much as the kernels at K = 1)."""
    if not active:
        yield
        return
    prior = _set_stance(_SKIP_GUARDS)
    try:
        yield
    finally:
        _set_stance(prior)


class FusedStreamAC:
    """A StreamAC's state run by `step` (compiled or not) behind StreamAC's act() / learn():
    act() gives the action the previous learn() (or the first act) computed; learn() runs one
    step (the update, then the next act) on the packed state, in place. `state` reads it,
    `load` sets it, `sync_to(agent)` writes it back into a StreamAC."""

    def __init__(self, agent: StreamAC, compiled: bool = True, mode: str | None = None):
        self.spec = spec = spec_of(agent)
        self.agent, self.k, self.space = agent, agent.k, agent.space
        st = state_of(agent)
        fns, self.info_type = functions(spec)
        _, pend = fns.act(spec, st)  # the pending intermediates' shapes
        self.packing = packing = Packing(_without_core(st, pend))
        self.rest = packing.pack(_without_core(st, pend))
        n = self.n_core = len(st.core)
        # the cores' two sets of buffers: cores[cur] the pending state, the other the state
        self.cores = [tuple(t.clone() for t in st.core), tuple(t.clone() for t in pend.core)]
        self.cur = 1

        def act_fn(*buffers):
            return packed_act(spec, packing, n, *buffers)

        def step_fn(env, *buffers):
            return packed_step(spec, packing, n, env, *buffers)

        if compiled:
            opts = compile_options(mode)
            act_fn, step_fn = torch.compile(act_fn, **opts), torch.compile(step_fn, **opts)
        self._act, self._step = act_fn, step_fn
        self.compiled = compiled
        self.compile_seconds: float | None = None
        self._action: torch.Tensor | None = None

    def _call(self, fn, *args):
        """fn(*args); compiled, without dynamo's guard checks once both graphs exist (the
        inputs are always buffers of these shapes and an env array of one shape)."""
        with skip_guards(self.compile_seconds is not None):
            return fn(*args)

    @property
    def state(self) -> StepState:
        st, _ = self.packing.unpack(self.rest)
        return st._replace(core=self.cores[1 - self.cur])

    def load(self, st: StepState) -> None:
        """Set the state (the next act() acts on it)."""
        for buf, new in zip(self.cores[1 - self.cur], st.core, strict=True):
            buf.copy_(new)
        _, pend = self.packing.unpack(self.rest)
        for buf, new in zip(
            self.rest, self.packing.pack((st._replace(core=()), pend)), strict=True
        ):
            buf.copy_(new)
        self._action = None

    @torch.no_grad()  # as act() and learn() run: grad mode is part of the compiled graph's key
    def warm_up(self) -> float:
        """Compile both graphs now on copies of the buffers (nothing of the agents changes);
        returns the seconds taken."""
        start = time.perf_counter()
        st_core = tuple(t.clone() for t in self.cores[1 - self.cur])
        pend_core = tuple(t.clone() for t in self.cores[self.cur])
        rest = tuple(b.clone() for b in self.rest)
        self._act(*st_core, *pend_core, *rest)
        k, o = self.k, self.spec.obs_size
        self._step(torch.zeros(k, 3 + 2 * o, dtype=torch.float64), *pend_core, *st_core, *rest)
        self.compile_seconds = time.perf_counter() - start if self.compiled else 0.0
        return self.compile_seconds

    @torch.no_grad()
    def act(self) -> torch.Tensor:
        if self.compiled and self.compile_seconds is None:
            self.warm_up()
        if self._action is None:
            state, pending = self.cores[1 - self.cur], self.cores[self.cur]
            self._action = self._call(self._act, *state, *pending, *self.rest)
        return self._action

    @torch.no_grad()
    def learn(self, reward, obs, final_obs, terminated, truncated) -> StepInfo:
        env = torch.from_numpy(env_array(reward, obs, final_obs, terminated, truncated, self.k))
        pending, free = self.cores[self.cur], self.cores[1 - self.cur]
        self._action, info = self._call(self._step, env, *pending, *free, *self.rest)
        self.cur = 1 - self.cur  # the next act's state went into the free set
        return self.info_type(*info)

    # views StreamRuntime's metrics read
    @property
    def theta_a(self) -> torch.Tensor:
        return self.state.params[0, :, : self.agent.actor.layout.size]

    @property
    def theta_c(self) -> torch.Tensor:
        return self.state.params[1, :, : self.agent.critic.layout.size]

    def sync_to(self, agent: StreamAC | None = None) -> None:
        sync_to(self.agent if agent is None else agent, self.state)
