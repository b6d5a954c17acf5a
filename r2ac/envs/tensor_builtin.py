"""The built-in memory tasks of r2ac/envs/builtin.py as pure functions of torch tensors.

K streams step in lockstep with no numpy, no Python branching on data and no host sync, so
that a step can run inside `torch.compile(fullgraph=True)` beside an agent's step:

    params = tensor_params("memory-chain", prev_action=True, length=32)
    state, obs = agent_reset(params, [seed + k for k in range(K)])
    out = step(params, state, actions)      # a TensorStep; out.state is the next state

Every draw, counter and auto-reset is the numpy env's (`_CounterRNGEnv._finish_step`), so
both give the same bits for the same seeds and actions (tests/envs/test_tensor_builtin.py):
the transition's reward, terminated and truncated; a finished stream's counters advance
(episode + 1, t = 0) and its new episode begins in the same call (`torch.where` per row);
`obs` is the next episode's first observation where a stream finished and `final_obs` the
observation the ended episode finished on. With `prev_action`, both end with the
previous-action code of r2ac/rl/stream/envs.py's `PreviousActionInput` (one-hot of the
action just taken, zeros in `obs` at an episode's first step, present in `final_obs`).

Not carried over: the first-episode cut (`--decorrelate-steps`), which only the batched
actors use, and the numpy env's action check (an action out of range is undefined here; the
`TensorBuiltinEnv` adapter checks its numpy actions as the numpy env does).

`TensorBuiltinEnv` wraps the functions as a `BatchedEnv` (numpy in and out, the numpy env's
`get_state`/`set_state` dict form) and offers `step_tensors` for callers that keep tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from r2ac.counter_hash import hashed_ints_torch
from r2ac.envs import builtin
from r2ac.envs.base import ArraySpec, BatchedEnv, StepResult, stream_seeds
from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError

# ---------------------------------------------------------------- state and outputs


class EnvState(NamedTuple):
    """All K streams' state; every tensor has the stream axis first."""

    seeds: torch.Tensor  # (K,) int64, uint64 bits: each stream's hash seed
    episode: torch.Tensor  # (K,) int64: episodes begun - 1 (the hash's episode index)
    t: torch.Tensor  # (K,) int64: steps into the episode
    returns: torch.Tensor  # (K,) float64: the running episode's return so far
    lengths: torch.Tensor  # (K,) int64: the running episode's steps so far
    task: NamedTuple  # the task's own arrays (CueArrays, WatermazeArrays, or () for chains)


class CueArrays(NamedTuple):
    cue: torch.Tensor  # (K,) int64: cue / sample object
    other: torch.Tensor  # (K,) int64: novel object (nonmatch)
    novel_slot: torch.Tensor  # (K,) int64: 0 = slot a, 1 = slot b


class WatermazeArrays(NamedTuple):
    pos: torch.Tensor  # (K,) int64: agent cell
    goal: torch.Tensor  # (K,) int64: goal cell
    last_reward: torch.Tensor  # (K,) float32
    last_action: torch.Tensor  # (K,) int64, -1 at an episode's first step


class ChainArrays(NamedTuple):
    """The chains keep no task arrays: their bits are functions of (seed, episode, step)."""


class TensorStep(NamedTuple):
    """What `step` returns: the next state and the numpy env's StepResult fields."""

    state: EnvState
    obs: torch.Tensor  # (K, D) float32: next obs (a new episode's first where one ended)
    reward: torch.Tensor  # (K,) float32
    terminated: torch.Tensor  # (K,) bool
    truncated: torch.Tensor  # (K,) bool
    final_obs: torch.Tensor  # (K, D) float32: the ended episode's last obs; obs elsewhere
    episode_return: torch.Tensor  # (K,) float64: the ended episode's return, NaN elsewhere
    episode_length: torch.Tensor  # (K,) int64: the ended episode's length, 0 elsewhere


def _draw(state: EnvState, purpose: int, high) -> torch.Tensor:
    """The numpy env's `_draw` for every stream (K,) int64: a hash of (seed, episode, t,
    purpose) modulo high. Drawing in all rows and keeping some equals drawing in those rows."""
    return hashed_ints_torch(state.seeds, state.episode, state.t, purpose, high)


def _hot(index: torch.Tensor, width: int, on: torch.Tensor | None = None) -> torch.Tensor:
    """(K, width) bool: column index[k] set in row k (where on[k], if given)."""
    hot = torch.arange(width, device=index.device) == index.unsqueeze(1)
    return hot if on is None else hot & on.unsqueeze(1)


def _pm_one(right: torch.Tensor, judged: torch.Tensor) -> torch.Tensor:
    """(K,) float64 reward: +1 right, -1 wrong where judged, 0 elsewhere."""
    one = torch.ones_like(right, dtype=torch.float64)
    return torch.where(judged, torch.where(right, one, -one), torch.zeros_like(one))


# ---------------------------------------------------------------- the tasks


class _Task:
    """A task's pure functions; subclasses are frozen dataclasses of its Python options."""

    num_actions: int
    prev_action: bool

    @property
    def obs_size(self) -> int:
        """Width of the task's own observation (before any previous-action code)."""
        raise NotImplementedError

    def empty_task(self, like: torch.Tensor) -> NamedTuple:
        """Task arrays of K zeros (the numpy env's arrays before its first reset)."""
        raise NotImplementedError

    def begin(self, state: EnvState, rows: torch.Tensor) -> EnvState:
        """New episodes' task arrays in the `rows` (K,) bool (counters already at t = 0)."""
        return state

    def observe(self, state: EnvState) -> torch.Tensor:
        """(K, obs_size) float32 observation of the current step."""
        raise NotImplementedError

    def transition(self, state: EnvState, actions: torch.Tensor):
        """One step before accounting: (state with t + 1 and the task arrays moved, reward
        (K,) float64, terminated (K,) bool, truncated (K,) bool)."""
        raise NotImplementedError


@dataclass(frozen=True)
class DelayedCueParams(_Task):
    """`builtin.DelayedCue`: obs [slot a one-hot (n) | slot b one-hot (n) | phase (3)]."""

    delay: int = 64
    num_cues: int = 2
    variant: str = "cue"
    prev_action: bool = False

    @property
    def num_actions(self) -> int:
        return self.num_cues if self.variant == "cue" else 2

    @property
    def obs_size(self) -> int:
        return 2 * self.num_cues + 3

    def empty_task(self, like: torch.Tensor) -> CueArrays:
        return CueArrays(*(torch.zeros_like(like) for _ in range(3)))

    def begin(self, state: EnvState, rows: torch.Tensor) -> EnvState:
        n, old = self.num_cues, state.task
        cue = _draw(state, 1, n)
        other = (cue + _draw(state, 2, n - 1) + 1) % n  # != cue
        novel_slot = _draw(state, 3, 2)
        task = CueArrays(
            torch.where(rows, cue, old.cue),
            torch.where(rows, other, old.other),
            torch.where(rows, novel_slot, old.novel_slot),
        )
        return state._replace(task=task)

    def observe(self, state: EnvState) -> torch.Tensor:
        n, task, width = self.num_cues, state.task, self.obs_size
        at_cue, at_choice = state.t == 0, state.t == self.delay + 1
        two, one = torch.full_like(state.t, 2), torch.ones_like(state.t)
        phase = torch.where(at_cue, torch.zeros_like(state.t), torch.where(at_choice, two, one))
        hot = _hot(task.cue, width, at_cue) | _hot(2 * n + phase, width)  # (K, W)
        if self.variant == "nonmatch":  # the novel object in its slot, the sample in the other
            novel = task.novel_slot
            hot = hot | _hot(novel * n + task.other, width, at_choice)
            hot = hot | _hot((1 - novel) * n + task.cue, width, at_choice)
        return hot.to(torch.float32)

    def transition(self, state: EnvState, actions: torch.Tensor):
        terminated = state.t == self.delay + 1  # the choice was just made
        correct = state.task.cue if self.variant == "cue" else state.task.novel_slot
        reward = _pm_one(actions == correct, terminated)
        return state._replace(t=state.t + 1), reward, terminated, torch.zeros_like(terminated)


@dataclass(frozen=True)
class WatermazeParams(_Task):
    """`builtin.Watermaze`: obs [row one-hot | col one-hot | last reward (| last action)]."""

    size: int = 8
    episode_steps: int = 200
    last_action: bool = False
    prev_action: bool = False
    num_actions = 4

    @property
    def obs_size(self) -> int:
        return 2 * self.size + 1 + (self.num_actions if self.last_action else 0)

    def empty_task(self, like: torch.Tensor) -> WatermazeArrays:
        zeros = torch.zeros_like(like)
        return WatermazeArrays(
            zeros, zeros.clone(), zeros.to(torch.float32), torch.full_like(like, -1)
        )

    def _cell_except(self, state: EnvState, purpose: int, avoid: torch.Tensor) -> torch.Tensor:
        """(K,) uniform cell != avoid (K,), the numpy env's `_random_cell_except`."""
        draw = _draw(state, purpose, self.size * self.size - 1)
        return draw + (draw >= avoid).to(torch.int64)

    def begin(self, state: EnvState, rows: torch.Tensor) -> EnvState:
        old = state.task
        goal = _draw(state, 1, self.size * self.size)
        pos = self._cell_except(state, 2, goal)
        task = WatermazeArrays(
            torch.where(rows, pos, old.pos),
            torch.where(rows, goal, old.goal),
            old.last_reward.masked_fill(rows, 0.0),
            old.last_action.masked_fill(rows, -1),
        )
        return state._replace(task=task)

    def observe(self, state: EnvState) -> torch.Tensor:
        s, task, width = self.size, state.task, self.obs_size
        hot = _hot(task.pos // s, width) | _hot(s + task.pos % s, width)  # (K, W)
        if self.last_action:
            acted = task.last_action >= 0
            hot = hot | _hot(2 * s + 1 + task.last_action, width, acted)
        at_reward = torch.arange(width, device=hot.device) == 2 * s  # (W,)
        return torch.where(at_reward, task.last_reward.unsqueeze(1), hot.to(torch.float32))

    def transition(self, state: EnvState, actions: torch.Tensor):
        s, task = self.size, state.task
        # moves 0 up, 1 down, 2 left, 3 right; off the arena stays in place
        d_row = (actions == 1).to(torch.int64) - (actions == 0).to(torch.int64)
        d_col = (actions == 3).to(torch.int64) - (actions == 2).to(torch.int64)
        row = (task.pos // s + d_row).clamp(0, s - 1)
        col = (task.pos % s + d_col).clamp(0, s - 1)
        pos = row * s + col
        found = pos == task.goal  # (K,)
        state = state._replace(t=state.t + 1)
        pos = torch.where(found, self._cell_except(state, 3, task.goal), pos)  # teleport
        task = WatermazeArrays(pos, task.goal, found.to(torch.float32), actions.to(torch.int64))
        truncated = state.t == self.episode_steps
        reward = found.to(torch.float64)
        return state._replace(task=task), reward, torch.zeros_like(found), truncated


@dataclass(frozen=True)
class _ChainParams(_Task):
    """`builtin._Chain`: obs [time to live | query flag | bit +1 / -1 or 0], 2 actions."""

    num_actions = 2

    @property
    def obs_size(self) -> int:
        return 3

    def empty_task(self, like: torch.Tensor) -> ChainArrays:
        return ChainArrays()

    def bit_at(self, state: EnvState, steps: torch.Tensor) -> torch.Tensor:
        """(K,) the 0/1 bit of each stream's episode at steps (K,) (below 0: step 0's)."""
        return hashed_ints_torch(state.seeds, state.episode, steps.clamp(min=0), 1, 2)

    def queried(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def shown(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def correct(self, state: EnvState) -> torch.Tensor:
        raise NotImplementedError

    def observe(self, state: EnvState) -> torch.Tensor:
        t = state.t
        ttl = 1.0 - t.to(torch.float64) / self.length  # in float64 as numpy, then rounded
        bit = (2 * self.bit_at(state, t) - 1).to(torch.float64)
        bit = torch.where(self.shown(t), bit, torch.zeros_like(bit))
        query = self.queried(t).to(torch.float64)
        return torch.stack([ttl, query, bit], 1).to(torch.float32)  # (K, 3)

    def transition(self, state: EnvState, actions: torch.Tensor):
        reward = _pm_one(actions == self.correct(state), self.queried(state.t))
        t = state.t + 1
        terminated = t == self.length
        return state._replace(t=t), reward, terminated, torch.zeros_like(terminated)


@dataclass(frozen=True)
class MemoryChainParams(_ChainParams):
    """`builtin.MemoryChain`: the context bit at t = 0, asked for at t = length - 1."""

    length: int = 32
    prev_action: bool = False

    def queried(self, t):
        return t == self.length - 1

    def shown(self, t):
        return t == 0

    def correct(self, state):
        return self.bit_at(state, torch.zeros_like(state.t))


@dataclass(frozen=True)
class KMemoryChainParams(_ChainParams):
    """`builtin.KMemoryChain`: a bit every step; from t = k on, asks for the bit of t - k."""

    k: int = 8
    length: int = 64
    prev_action: bool = False

    def queried(self, t):
        return t >= self.k

    def shown(self, t):
        return torch.ones_like(t, dtype=torch.bool)

    def correct(self, state):
        return self.bit_at(state, state.t - self.k)


TENSOR_TASKS = {
    "delayed-cue": (builtin.DelayedCue, DelayedCueParams),
    "watermaze": (builtin.Watermaze, WatermazeParams),
    "memory-chain": (builtin.MemoryChain, MemoryChainParams),
    "k-memory-chain": (builtin.KMemoryChain, KMemoryChainParams),
}


def _saved_arrays(params: _Task) -> tuple[str, ...]:
    """The task arrays the numpy env saves in get_state (its `_task_arrays`)."""
    return next(n._task_arrays for n, p in TENSOR_TASKS.values() if type(params) is p)


def tensor_params(task: str, prev_action: bool = False, **options: Any) -> _Task:
    """The params of `builtin/<task>` with `options` (checked by the numpy env's own
    constructor, so both accept the same options); `prev_action` appends the code."""
    if task not in TENSOR_TASKS:
        raise ConfigError(f"no tensor form of builtin/{task}; known: {sorted(TENSOR_TASKS)}")
    env = builtin.make_builtin(task, 1, 0, **options)  # validates
    return params_of(env, prev_action)


def params_of(env: builtin._CounterRNGEnv, prev_action: bool = False) -> _Task:
    """The params equal to a numpy built-in env's options."""
    for numpy_cls, params_cls in TENSOR_TASKS.values():
        if type(env) is numpy_cls:
            names = [f for f in params_cls.__dataclass_fields__ if f != "prev_action"]
            opts = {name: getattr(env, name) for name in names}
            if numpy_cls is builtin.Watermaze:
                opts["last_action"] = env.show_last_action
            return params_cls(**opts, prev_action=prev_action)
    raise ConfigError(f"no tensor form of {type(env).__name__}")


# ---------------------------------------------------------------- the functional API


def obs_width(params: _Task) -> int:
    """Width of the observations `reset`/`step` return (with the previous-action code)."""
    return params.obs_size + (params.num_actions if params.prev_action else 0)


def agent_stream_seeds(seeds: list[int], device=None) -> torch.Tensor:
    """(K,) int64 hash seeds for K agents, stream k as `make_env(cfg, 1, seeds[k])` seeds
    it (the streaming runtime's `make_agent_envs`)."""
    values = [int(stream_seeds(s, 1)[0]) for s in seeds]
    return torch.tensor(values, dtype=torch.int64, device=device)


def batch_stream_seeds(seed: int, num_envs: int, device=None) -> torch.Tensor:
    """(K,) int64 hash seeds of one batched env `make(..., num_envs, seed)`."""
    values = stream_seeds(seed, num_envs).astype(np.int64)
    return torch.from_numpy(values).to(device)


def _with_code(obs: torch.Tensor, code: torch.Tensor | None) -> torch.Tensor:
    return obs if code is None else torch.cat([obs, code], 1)  # (K, obs_size + n)


def _blank_state(params: _Task, seeds: torch.Tensor) -> EnvState:
    """Counters and task arrays at zero (the numpy env before its first reset). Each field
    its own tensor: a compiled step specialises on inputs that alias one another."""
    zeros = [torch.zeros_like(seeds) for _ in range(3)]
    returns = torch.zeros_like(seeds, dtype=torch.float64)
    return EnvState(seeds, *zeros[:2], returns, zeros[2], params.empty_task(seeds))


def reset(
    params: _Task, seeds: torch.Tensor, episode: torch.Tensor | None = None
) -> tuple[EnvState, torch.Tensor]:
    """New episodes at t = 0 in every stream: (state, obs (K, D) float32).

    seeds: (K,) int64 (`agent_stream_seeds`, `batch_stream_seeds`); episode: (K,) int64
    episode index to begin, 0 by default (the numpy env's `reset(seed)`; its `reset()`
    without a seed begins episode + 1, the runtime's first episode is 1)."""
    state = _blank_state(params, seeds)
    if episode is not None:
        state = state._replace(episode=episode)
    state = params.begin(state, torch.ones_like(seeds, dtype=torch.bool))
    code = None
    if params.prev_action:
        code = torch.zeros(
            seeds.shape[0], params.num_actions, dtype=torch.float32, device=seeds.device
        )
    return state, _with_code(params.observe(state), code)


def agent_reset(params: _Task, seeds: list[int], device=None) -> tuple[EnvState, torch.Tensor]:
    """K agents' streams as the streaming runtime begins them (`make_agent_envs`, then
    `reset()`: stream k seeded as `make_env(cfg, 1, seeds[k])`, in its episode 1)."""
    hash_seeds = agent_stream_seeds(seeds, device)
    return reset(params, hash_seeds, torch.ones_like(hash_seeds))


def step(params: _Task, state: EnvState, actions: torch.Tensor) -> TensorStep:
    """Apply actions (K,) int64 in [0, num_actions), then auto-reset the streams that ended
    (the numpy env's `_finish_step` and, with prev_action, `PreviousActionInput.step`)."""
    moved, reward, terminated, truncated = params.transition(state, actions)
    done = terminated | truncated  # (K,)
    # episode stats (EpisodeStats.update)
    returns, lengths = moved.returns + reward, moved.lengths + 1
    episode_return = torch.where(done, returns, torch.full_like(returns, math.nan))
    episode_length = torch.where(done, lengths, torch.zeros_like(lengths))
    final_obs = params.observe(moved)  # (K, obs_size): the step observed before any reset
    # finished streams: counters to the next episode's start, its task arrays drawn
    nxt = moved._replace(
        episode=moved.episode + done.to(torch.int64),
        t=torch.where(done, torch.zeros_like(moved.t), moved.t),
        returns=torch.where(done, torch.zeros_like(returns), returns),
        lengths=torch.where(done, torch.zeros_like(lengths), lengths),
    )
    nxt = params.begin(nxt, done)
    obs = params.observe(nxt)  # rows that go on: the same state as final_obs's
    code = final_code = None
    if params.prev_action:  # one-hot of the action taken; zeros where a new episode begins
        final_code = _hot(actions.clamp(0, params.num_actions - 1), params.num_actions)
        final_code = final_code.to(torch.float32)  # (K, n)
        code = final_code.masked_fill(done.unsqueeze(1), 0.0)
    return TensorStep(
        state=nxt,
        obs=_with_code(obs, code),
        reward=reward.to(torch.float32),
        terminated=terminated,
        truncated=truncated,
        final_obs=_with_code(final_obs, final_code),
        episode_return=episode_return,
        episode_length=episode_length,
    )


# ---------------------------------------------------------------- the BatchedEnv adapter


class TensorBuiltinEnv(BatchedEnv):
    """A built-in task as a BatchedEnv over the tensor functions: numpy in and out as every
    backend, `step_tensors` for tensors, and the numpy env's get_state/set_state dicts (a
    checkpoint of either resumes in the other). With `prev_action` its observations carry
    the previous-action code (it stands for `PreviousActionInput(numpy env)`)."""

    def __init__(self, params: _Task, seeds: torch.Tensor, checker=None):
        self.params, self.num_envs = params, int(seeds.shape[0])
        self.num_actions = params.num_actions
        self.observation_spec = ArraySpec((obs_width(params),), np.dtype(np.float32))
        self.state = _blank_state(params, seeds)
        self.checker = checker  # a numpy env of these options: set_state's checks

    @classmethod
    def like(cls, env: builtin._CounterRNGEnv, prev_action: bool = False) -> TensorBuiltinEnv:
        """The tensor form of the numpy env `env` (its options and stream seeds, before its
        first reset); `env` stays as the checker of saved states."""
        if env.first_cut is not None:
            raise ConfigError("the tensor form of a built-in env has no first-episode cut")
        seeds = torch.from_numpy(np.asarray(env.seeds, dtype=np.uint64).view(np.int64).copy())
        return cls(params_of(env, prev_action), seeds, checker=env)

    @classmethod
    def make(cls, task: str, num_envs: int, seed: int = 0, prev_action=False, **options):
        """As `make("builtin/<task>", num_envs, seed, **options)`."""
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        return cls(tensor_params(task, prev_action, **options), batch_stream_seeds(seed, num_envs))

    @classmethod
    def for_agents(cls, task: str, seeds: list[int], prev_action=False, **options):
        """As the streaming runtime's `make_agent_envs` (with `PreviousActionInput` under
        prev_action): stream k seeded as `make("builtin/<task>", 1, seeds[k])`."""
        return cls(tensor_params(task, prev_action, **options), agent_stream_seeds(seeds))

    @property
    def action_space(self) -> ActionSpace:
        return ActionSpace.discrete(self.num_actions)

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            seeds, episode = batch_stream_seeds(seed, self.num_envs), None
        else:
            seeds, episode = self.state.seeds, self.state.episode + 1
        self.state, obs = reset(self.params, seeds, episode)
        return obs.numpy()

    def step_tensors(self, actions: torch.Tensor) -> TensorStep:
        out = step(self.params, self.state, actions)
        self.state = out.state
        return out

    def step(self, actions: np.ndarray) -> StepResult:
        out = self.step_tensors(torch.from_numpy(self._check_actions(actions)))
        info = {
            "episode_return": out.episode_return.numpy(),
            "episode_length": out.episode_length.numpy(),
            "final_obs": out.final_obs.numpy(),
        }
        flags = (out.terminated.numpy(), out.truncated.numpy())
        return StepResult(out.obs.numpy(), out.reward.numpy(), *flags, info)

    def get_state(self) -> dict[str, Any]:
        s = self.state
        state = {
            "seeds": s.seeds.numpy().view(np.uint64).copy(),
            "episode": s.episode.numpy().copy(),
            "t": s.t.numpy().copy(),
            "stats": {"returns": s.returns.numpy().copy(), "lengths": s.lengths.numpy().copy()},
        }
        for name in _saved_arrays(self.params):
            state[name] = getattr(s.task, name).numpy().copy()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        if self.checker is not None:  # every field checked as the numpy env checks it
            self.checker.set_state(state)

        def tensor(name: str, source=state, dtype=torch.int64) -> torch.Tensor:
            return torch.as_tensor(np.asarray(source[name]).astype(np.int64), dtype=dtype)

        task = self.state.task
        names = _saved_arrays(self.params)
        if names:
            given = {name: torch.from_numpy(np.array(state[name])) for name in names}
            given = {n: v.to(getattr(task, n).dtype) for n, v in given.items()}
            task = task._replace(**given)
        seeds = torch.from_numpy(np.asarray(state["seeds"], dtype=np.uint64).view(np.int64))
        stats = state["stats"]
        self.state = EnvState(
            seeds=seeds.clone(),
            episode=tensor("episode"),
            t=tensor("t"),
            returns=torch.as_tensor(np.asarray(stats["returns"], dtype=np.float64)),
            lengths=tensor("lengths", stats),
            task=task,
        )
