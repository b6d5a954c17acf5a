"""Many streaming steps per compiled call, the built-in env inside (`FusedStreamLoop`).

One call of the compiled per-step function (compiled.py) costs ~100 us on a CPU before any
arithmetic (the call itself, the env in numpy, the conversions between them), several times
the arithmetic of a small agent. Here the agents' step (compiled_math.py) and the built-in
env's (r2ac/envs/tensor_builtin.py) run together in one `while_loop` (torch's higher-order
loop, which inductor compiles into a C++ loop around the step's kernels: ~3 us a step of
overhead instead of ~100), n steps per call, n a tensor so that one graph serves any length:

    repeat n times:
        action, pending = act(state)
        env_state, obs, reward, ... = env.step(env_state, action)
        state, info = learn(state, pending, reward, obs, ...)
        the step's ended episodes into row i of (N, K) logs; the info's means summed

The loop carries the state alone (StepState: weights, traces, core states, normalisers, the
current observation), the env's state and the logs: what act keeps for learn lives inside
one step, where the compiler fuses it away instead of allocating buffers for it each step.
The same chunk boundaries give the same bits: the runtime sets them by the update counter
(log, checkpoint and end cadences), so a resumed run computes what the uninterrupted one did.

Covered: what compiled.py covers (stream AC and QRC), on a built-in env with a tensor form (memory-chain,
k-memory-chain, delayed-cue, watermaze, ...), with or without the previous action. Other envs
run the per-step compiled function beside their own (numpy) step.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch._higher_order_ops.while_loop import while_loop
from torch.utils._pytree import tree_flatten, tree_unflatten

from r2ac.envs import tensor_builtin as tb
from r2ac.rl.learning.actor import EpisodeLog
from r2ac.rl.stream.ac import StreamAC
from r2ac.rl.stream.compiled import compile_options, functions, skip_guards
from r2ac.rl.stream.compiled_spec import StepSpec, StepState, spec_of, state_of, sync_to

# steps per call at most: the (N, K) episode logs' rows; the call overhead (~60-100 us)
# spread over 64 steps is ~1-2 us a step
CHUNK = 64

# glibc's malloc: blocks up to this size from the heap, and the heap kept up to this much
# free (bytes). The loop's body allocates its intermediates every step (inductor's memory
# planning does not cover a loop body); above glibc's default thresholds (128 KB) each would
# be a fresh mmap, its pages faulted in and zeroed every step: at K = 16 on the preset's
# network, 430 k page faults in 5 s and a sixth of the time.
HEAP_BLOCKS = 32 << 20  # glibc's largest on 64-bit
HEAP_KEPT = 1 << 30  # (a C int)


def keep_allocations_on_the_heap() -> bool:
    """glibc's mmap and trim thresholds raised (HEAP_BLOCKS, HEAP_KEPT) for this process;
    False where the C library is not glibc (nothing changed)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    blocks = mallopt(m_mmap_threshold, HEAP_BLOCKS)
    kept = mallopt(m_trim_threshold, HEAP_KEPT)
    return bool(blocks and kept)


def _step_means(info) -> torch.Tensor:
    """(5,) float64: mean |delta| and the other fields' means over the K agents (what the
    per-step runtime adds to its metric sums)."""
    return torch.stack([info[0].abs(), *info[1:]]).mean(1).to(torch.float64)


def first_of(leaves) -> tuple[int, ...]:
    """Per leaf, the index of the first leaf that is the same tensor (a step's pending holds
    some tensors twice: the action, the core's input rows)."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(t), i) for i, t in enumerate(leaves))


def _carry(tree, first: tuple[int, ...], copy: tuple[bool, ...] | None = None) -> list:
    """The loop's carried tensors: `tree`'s leaves once each (the compiler would merge two
    copies of one tensor into one buffer), copied where `copy` says (default: all). A loop's
    carried values may alias neither each other nor its inputs: its first inputs are copies,
    and a step's outputs are copied where they are its inputs unchanged (the seeds)."""
    leaves = tree_flatten(tree)[0]
    copy = copy or (True,) * len(leaves)
    return [t.clone() if copy[i] else t for i, t in enumerate(leaves) if first[i] == i]


def _uncarry(carried, first: tuple[int, ...], treedef):
    slot = {j: n for n, j in enumerate(sorted(set(first)))}
    return tree_unflatten([carried[slot[j]] for j in first], treedef)


def one_step(spec: StepSpec, params: tb._Task, st, env_state):
    """The agents act, the envs take the actions, the agents learn: (state, env's TensorStep,
    StepInfo). What act keeps for learn stays inside the step (no buffer of its own)."""
    fns = functions(spec)[0]
    action, pend = fns.act(spec, st)
    out = tb.step(params, env_state, action)
    f64 = torch.float64
    st, info = fns.learn(
        spec, st, pend, out.reward.to(f64), out.obs.to(f64), out.final_obs.to(f64),
        out.terminated, out.truncated,
    )  # fmt: skip
    return st, out, info


def run_chunk(spec: StepSpec, params: tb._Task, nmax: int, aliases, n: torch.Tensor, st, env_state):
    """n (a () int64 tensor, 1 <= n <= nmax) steps of the K agents on their envs: (state,
    env_state, metric sums (5,) float64, episode returns (nmax, K) float64 with NaN where no
    episode ended, episode lengths (nmax, K) int64). Pure: nothing given is changed.
    aliases: (`first_of` the carried leaves, which of a step's outputs the loop copies), from
    `chunk_aliases`."""
    k = spec.k
    first, copied = aliases
    returns = torch.full((nmax, k), math.nan, dtype=torch.float64)
    lengths = torch.zeros((nmax, k), dtype=torch.int64)
    sums = torch.zeros(5, dtype=torch.float64)
    tree = (st, env_state, returns, lengths, sums)
    treedef = tree_flatten(tree)[1]

    def cond(i, *carried):
        return i < n

    def body(i, *carried):
        st, env_state, returns, lengths, sums = _uncarry(carried, first, treedef)
        st, out, info = one_step(spec, params, st, env_state)
        row = i.view(1)
        returns = returns.index_copy(0, row, out.episode_return.view(1, k))
        lengths = lengths.index_copy(0, row, out.episode_length.view(1, k))
        new = (st, out.state, returns, lengths, sums + _step_means(info))
        return (i + 1, *_carry(new, first, copied))

    start = torch.zeros((), dtype=torch.int64)
    _, *carried = while_loop(cond, body, (start, *_carry(tree, first)))
    st, env_state, returns, lengths, sums = _uncarry(carried, first, treedef)
    return st, env_state, sums, returns, lengths


def chunk_aliases(spec: StepSpec, params: tb._Task, st, env_state):
    """(`first_of` the loop's carried leaves, per leaf whether the loop must copy a step's
    output), from one eager step (the step's outputs repeat the same way; checked)."""
    logs = [torch.zeros(0) for _ in range(3)]  # stand-ins for the logs and sums
    leaves = tree_flatten((st, env_state, *logs))[0]
    first = first_of(leaves)
    st, out, _ = one_step(spec, params, st, env_state)
    outs = tree_flatten((st, out.state, *logs))[0]
    if first_of(outs) != first:
        raise RuntimeError("compiled stream loop: a step's outputs repeat unlike its inputs")
    # copied: an output that shares memory with an input (passed on, or a view of one) or
    # with an earlier output other than itself (a view of it)
    given = {t.untyped_storage().data_ptr() for t in leaves}
    seen: dict[int, int] = {}
    copy = []
    for i, t in enumerate(outs):
        ptr = t.untyped_storage().data_ptr()
        copy.append(ptr in given or seen.setdefault(ptr, first[i]) != first[i])
    copy[-len(logs) :] = [False] * len(logs)  # the logs and sums: fresh every step
    return first, tuple(copy)


class FusedStreamLoop:
    """K StreamAC agents and their built-in envs (a `TensorBuiltinEnv`) run `run_chunk` at a
    time, compiled or not. `run(n)` advances n steps; `state` is the agents' StepState,
    `env.state` the envs'; `load` sets the agents' state (the env's is read from `env`
    each call), `sync_to(agent)` writes it back into a StreamAC."""

    def __init__(self, agent: StreamAC, env: tb.TensorBuiltinEnv, compiled: bool = True,
                 nmax: int = CHUNK, mode: str | None = None):  # fmt: skip
        self.spec = spec = spec_of(agent)
        self.agent, self.env, self.k, self.nmax = agent, env, agent.k, nmax
        self.state: StepState = state_of(agent)
        params = env.params
        with torch.no_grad():
            aliases = chunk_aliases(spec, params, self.state, env.state)

        def chunk(n, st, env_state):
            return run_chunk(spec, params, nmax, aliases, n, st, env_state)

        # inductor's memory planning does not cover a while_loop's body (its C++ then names
        # buffers it never declared): off here
        opts = compile_options(mode, memory_planning=False)
        self._chunk = torch.compile(chunk, **opts) if compiled else chunk
        self.compiled = compiled
        if compiled:
            keep_allocations_on_the_heap()
        self.compile_seconds: float | None = None

    @torch.no_grad()
    def warm_up(self) -> float:
        """Compile now on copies of the state (nothing changes); returns the seconds taken."""
        start = time.perf_counter()
        leaves, treedef = tree_flatten((self.state, self.env.state))
        st, env_state = tree_unflatten([t.clone() for t in leaves], treedef)
        self._chunk(torch.tensor(1), st, env_state)
        self.compile_seconds = time.perf_counter() - start if self.compiled else 0.0
        return self.compile_seconds

    @torch.no_grad()
    def run(self, n: int) -> tuple[torch.Tensor, EpisodeLog]:
        """n steps (1 <= n <= nmax): the metric sums (5,) float64 and the episodes that ended,
        in step order (agents in index order within a step)."""
        if not 1 <= n <= self.nmax:
            raise ValueError(f"a chunk is 1..{self.nmax} steps, got {n}")
        if self.compiled and self.compile_seconds is None:
            self.warm_up()
        with skip_guards(self.compile_seconds is not None and self.compiled):
            st, env_state, sums, returns, lengths = self._chunk(
                torch.tensor(n), self.state, self.env.state
            )
        self.state, self.env.state = st, env_state
        rets, lens = returns[:n].numpy(), lengths[:n].numpy()
        ended = ~np.isnan(rets)
        return sums, EpisodeLog(rets[ended].tolist(), lens[ended].tolist())

    def load(self, st: StepState) -> None:
        self.state = st

    def sync_to(self, agent: StreamAC | None = None) -> None:
        sync_to(self.agent if agent is None else agent, self.state)
