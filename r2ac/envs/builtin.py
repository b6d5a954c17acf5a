"""Built-in memory tasks: batched, pure numpy, bit-deterministic, no extra dependencies.

`DelayedCue` (`builtin/delayed-cue`): a cue is shown at the first step only, then `delay`
blank steps, then a choice step that is rewarded +1 if right and -1 if wrong. Variant
"cue" (T-maze): the choice must name the cue. Variant "nonmatch" (select-non-matching
object): a sample object is shown first; at the choice two objects appear, the sample and
a new one, in random slots, and the agent must pick the slot of the new one. Memory span
(cue to choice) = delay + 1 steps.

`Watermaze` (`builtin/watermaze`): a size x size arena with a hidden goal cell. Entering it
gives reward 1 and teleports the agent to a random other cell; the episode lasts
`episode_steps` steps. After the first find, a policy that remembers the goal walks back
in ~ the Manhattan distance; one that cannot must search again. The span from a find to
its use is up to `episode_steps` steps.

`MemoryChain` (`builtin/memory-chain`): bsuite's memory_len. A context bit is shown at the
first step and asked for at the last (`length` steps in all): +1 if the answer is right,
-1 if wrong. `KMemoryChain` (`builtin/k-memory-chain`): a fresh bit every step, and every
step from the k-th on asks for the bit shown k steps earlier (+1 / -1 per step). Both have
two actions and an observation [time to live, query flag, bit]; chance is 0 on both.

Scores of random / best memoryless / optimal scripted policies are in docs/envs.md and are
asserted by tests/envs/test_builtin_scores.py; the policies are in `r2ac.envs.scripted`.

Randomness is counter-based: every draw is a hash of (stream seed, episode index, step,
purpose), so a stream's trajectory depends only on its own seed and actions (not on the
batch size), and the whole state is a few integer arrays (`get_state`/`set_state`).
Every task ends episodes at a fixed length that is part of the task: the delayed-cue choice
and the chains' last step are terminations; the watermaze horizon is a time limit and
reported as truncation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from r2ac.counter_hash import hashed_ints
from r2ac.envs.base import (
    ArraySpec,
    BatchedEnv,
    EpisodeStats,
    FirstEpisodeCut,
    StepResult,
    check_options,
    saved_array,
    stream_seeds,
)
from r2ac.errors import ConfigError

# The longest episode a built-in task takes (an evaluation of 300 episodes must end).
MAX_EPISODE_STEPS = 100_000


class _CounterRNGEnv(BatchedEnv):
    """Shared bookkeeping: per-stream seeds, episode and step counters, episode stats."""

    can_cut_episodes = True

    def __init__(self, num_envs: int, seed: int):
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.stats = EpisodeStats(num_envs)
        self._seed_streams(seed)

    def _seed_streams(self, seed: int) -> None:
        self.seeds = stream_seeds(seed, self.num_envs).astype(np.uint64)  # (B,)
        self.episode = np.zeros(self.num_envs, dtype=np.int64)  # (B,) episodes begun - 1
        self.t = np.zeros(self.num_envs, dtype=np.int64)  # (B,) steps into the episode

    def _draw(self, purpose: int, high, rows=slice(None)) -> np.ndarray:
        return hashed_ints(self.seeds[rows], self.episode[rows], self.t[rows], purpose, high)

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self._seed_streams(seed)
        else:
            self.episode += 1
        self.t[:] = 0
        self.stats.reset()
        self._start_cuts()
        self._begin_episodes(np.ones(self.num_envs, dtype=bool))
        return self._observe()

    def get_state(self) -> dict[str, Any]:
        names = ("seeds", "episode", "t", *self._task_arrays)
        state = {name: getattr(self, name).copy() for name in names}
        state["stats"] = self.stats.get_state()
        if self.first_cut is not None:
            state["first_cut"] = self.first_cut.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore get_state(). Every field is checked first (ConfigError naming it): a saved
        state comes from a file, and e.g. a position past the episode's end never ends it."""
        if not isinstance(state, dict):
            raise ConfigError(f"env state: a {type(state).__name__}, expected a dict")
        last = self.episode_steps - 1
        arrays = {
            "seeds": saved_array(state, "seeds", self.seeds, 0, 2**32 - 1),  # stream_seeds'
            "episode": saved_array(state, "episode", self.episode, 0, 2**62),
            "t": saved_array(state, "t", self.t, 0, last),
        }
        for name, (low, high) in self._task_bounds().items():
            arrays[name] = saved_array(state, name, getattr(self, name), low, high)
        self._check_task_state(arrays)
        EpisodeStats(self.num_envs).set_state(state.get("stats"), max_length=last)  # a check
        if self.first_cut is not None:
            cut = FirstEpisodeCut(self.num_envs, self.first_cut.max_steps, 0)
            cut.set_state(state.get("first_cut"))  # a check
        # all checked: now change
        for name, value in arrays.items():
            getattr(self, name)[:] = value
        self.stats.set_state(state["stats"], max_length=last)
        if self.first_cut is not None:
            self.first_cut.set_state(state["first_cut"])

    def _task_bounds(self) -> dict[str, tuple[int | None, int | None]]:
        """The task's own arrays -> their (low, high) (None: a float, only finite)."""
        return {}

    def _check_task_state(self, arrays: dict[str, np.ndarray]) -> None:
        """ConfigError where the checked arrays disagree with each other."""

    def _finish_step(self, reward, terminated, truncated) -> StepResult:
        """Account the step, start new episodes where one ended, observe."""
        truncated = self._with_cuts(terminated, truncated)
        done = terminated | truncated
        info = self.stats.update(reward, done)
        final_obs = self._observe() if done.any() else None
        self.episode[done] += 1
        self.t[done] = 0
        self._begin_episodes(done)
        obs = self._observe()
        info["final_obs"] = obs if final_obs is None else np.where(done[:, None], final_obs, obs)
        return StepResult(obs, reward.astype(np.float32), terminated, truncated, info)


class DelayedCue(_CounterRNGEnv):
    """Delayed cue / select-non-matching-object; obs (2K+3,) float32, see module docstring.

    Observation layout: [slot a one-hot (K) | slot b one-hot (K) | phase (cue, delay, choice)].
    Episode: t = 0 cue, t = 1..delay blank, t = delay+1 choice (the action there is judged).
    Actions: variant "cue": K (name the cue); variant "nonmatch": 2 (slot a or slot b).
    Actions before the choice are no-ops.
    """

    _task_arrays = ("cue", "other", "novel_slot")

    def __init__(
        self, num_envs: int, seed: int = 0, delay: int = 64, num_cues: int = 2, variant: str = "cue"
    ):
        if not 0 <= delay <= MAX_EPISODE_STEPS:
            raise ConfigError(f"delay must be in [0, {MAX_EPISODE_STEPS:,}], got {delay}")
        if variant not in ("cue", "nonmatch"):
            raise ConfigError(f"variant must be 'cue' or 'nonmatch', got {variant!r}")
        if num_cues < 2:
            raise ConfigError(f"num_cues must be >= 2, got {num_cues}")
        self.delay, self.num_cues, self.variant = delay, num_cues, variant
        self.num_actions = num_cues if variant == "cue" else 2
        self.observation_spec = ArraySpec((2 * num_cues + 3,), np.dtype(np.float32))
        self.cue = np.zeros(num_envs, dtype=np.int64)  # (B,) cue / sample object
        self.other = np.zeros(num_envs, dtype=np.int64)  # (B,) novel object (nonmatch)
        self.novel_slot = np.zeros(num_envs, dtype=np.int64)  # (B,) 0 = slot a, 1 = slot b
        super().__init__(num_envs, seed)

    @property
    def episode_steps(self) -> int:
        return self.delay + 2

    def _task_bounds(self) -> dict[str, tuple[int | None, int | None]]:
        k = self.num_cues
        return {"cue": (0, k - 1), "other": (0, k - 1), "novel_slot": (0, 1)}

    def _check_task_state(self, arrays: dict[str, np.ndarray]) -> None:
        same = np.flatnonzero(arrays["cue"] == arrays["other"])
        if same.size:
            b = int(same[0])
            raise ConfigError(f"env state other: equals cue at stream {b}, expected another")

    def correct_action(self) -> np.ndarray:
        """The action that would be rewarded at the choice step (B,)."""
        return self.cue if self.variant == "cue" else self.novel_slot

    def _begin_episodes(self, rows: np.ndarray) -> None:
        k = self.num_cues
        self.cue[rows] = self._draw(1, k, rows)
        offset = self._draw(2, k - 1, rows) + 1  # other != cue
        self.other[rows] = (self.cue[rows] + offset) % k
        self.novel_slot[rows] = self._draw(3, 2, rows)

    def _observe(self) -> np.ndarray:
        k, b = self.num_cues, np.arange(self.num_envs)
        obs = np.zeros((self.num_envs, 2 * k + 3), dtype=np.float32)  # (B, 2K+3)
        at_cue, at_choice = self.t == 0, self.t == self.delay + 1
        obs[b[at_cue], self.cue[at_cue]] = 1.0
        if self.variant == "nonmatch":
            rows = b[at_choice]
            novel = self.novel_slot[rows]
            obs[rows, novel * k + self.other[rows]] = 1.0
            obs[rows, (1 - novel) * k + self.cue[rows]] = 1.0
        phase = np.where(at_cue, 0, np.where(at_choice, 2, 1))
        obs[b, 2 * k + phase] = 1.0
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._check_actions(actions)
        terminated = self.t == self.delay + 1  # (B,) the choice was just made
        right = actions == self.correct_action()
        reward = np.where(terminated, np.where(right, 1.0, -1.0), 0.0)
        self.t += 1
        truncated = np.zeros(self.num_envs, dtype=bool)
        return self._finish_step(reward, terminated, truncated)


# Watermaze moves: 0 up, 1 down, 2 left, 3 right, as (row, col) steps.
MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], dtype=np.int64)


class Watermaze(_CounterRNGEnv):
    """Hidden-goal navigation; obs (2*size+1,) float32 = [row one-hot | col one-hot | last reward].

    Cells are numbered row * size + col. Moves off the arena leave the agent in place.
    With `last_action=True` the obs ends with a one-hot of the action just taken (4 more
    entries, all 0 on an episode's first step): after a find the agent is teleported, and the
    goal is where its last move led, which it cannot tell from the obs alone.
    """

    _task_arrays = ("pos", "goal", "last_reward")
    num_actions = 4

    def __init__(
        self,
        num_envs: int,
        seed: int = 0,
        size: int = 8,
        episode_steps: int = 200,
        last_action: bool = False,
    ):
        if size < 2:
            raise ConfigError(f"size must be >= 2, got {size}")
        if not 1 <= episode_steps <= MAX_EPISODE_STEPS:
            raise ConfigError(
                f"episode_steps must be in [1, {MAX_EPISODE_STEPS:,}], got {episode_steps}"
            )
        if not isinstance(last_action, bool):
            raise ConfigError(f"last_action must be true or false, got {last_action!r}")
        self.size, self.episode_steps, self.show_last_action = size, episode_steps, last_action
        width = 2 * size + 1 + (self.num_actions if last_action else 0)
        self.observation_spec = ArraySpec((width,), np.dtype(np.float32))
        self.pos = np.zeros(num_envs, dtype=np.int64)  # (B,) agent cell
        self.goal = np.zeros(num_envs, dtype=np.int64)  # (B,) goal cell
        self.last_reward = np.zeros(num_envs, dtype=np.float32)  # (B,)
        # (B,) -1: none yet. Not part of the saved env state: every step sets it before observing.
        self.last_action = np.full(num_envs, -1, dtype=np.int64)
        super().__init__(num_envs, seed)

    @property
    def num_cells(self) -> int:
        return self.size * self.size

    def _task_bounds(self) -> dict[str, tuple[int | None, int | None]]:
        cells = self.num_cells
        return {"pos": (0, cells - 1), "goal": (0, cells - 1), "last_reward": (None, None)}

    def _check_task_state(self, arrays: dict[str, np.ndarray]) -> None:
        on_goal = np.flatnonzero(arrays["pos"] == arrays["goal"])  # a find teleports away
        if on_goal.size:
            b = int(on_goal[0])
            raise ConfigError(f"env state pos: on the goal at stream {b}, expected another cell")
        reward = arrays["last_reward"]
        if not np.isin(reward, (0.0, 1.0)).all():
            raise ConfigError("env state last_reward: expected 0 or 1")

    def _random_cell_except(self, purpose: int, avoid: np.ndarray, rows) -> np.ndarray:
        """Uniform cell != avoid (n,) for the selected streams."""
        draw = self._draw(purpose, self.num_cells - 1, rows)
        return draw + (draw >= avoid)

    def _begin_episodes(self, rows: np.ndarray) -> None:
        self.goal[rows] = self._draw(1, self.num_cells, rows)
        self.pos[rows] = self._random_cell_except(2, self.goal[rows], rows)
        self.last_reward[rows] = 0.0
        self.last_action[rows] = -1

    def _observe(self) -> np.ndarray:
        s, b = self.size, np.arange(self.num_envs)
        obs = np.zeros((self.num_envs, *self.observation_spec.shape), dtype=np.float32)
        obs[b, self.pos // s] = 1.0
        obs[b, s + self.pos % s] = 1.0
        obs[:, 2 * s] = self.last_reward
        if self.show_last_action:
            acted = self.last_action >= 0
            obs[b[acted], 2 * s + 1 + self.last_action[acted]] = 1.0
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._check_actions(actions)
        s = self.size
        row = np.clip(self.pos // s + MOVES[actions, 0], 0, s - 1)
        col = np.clip(self.pos % s + MOVES[actions, 1], 0, s - 1)
        self.pos = row * s + col
        self.last_action = actions.astype(np.int64)
        found = self.pos == self.goal  # (B,)
        self.t += 1
        if found.any():
            self.pos[found] = self._random_cell_except(3, self.goal[found], found)
        reward = found.astype(np.float64)
        self.last_reward = found.astype(np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = self.t == self.episode_steps
        return self._finish_step(reward, terminated, truncated)


MAX_CHAIN_LENGTH = MAX_EPISODE_STEPS  # longest memory-chain episode


def _check_length(length: int) -> None:
    if not 2 <= length <= MAX_CHAIN_LENGTH:
        raise ConfigError(f"length must be an integer in [2, {MAX_CHAIN_LENGTH}], got {length}")


class _Chain(_CounterRNGEnv):
    """Shared by the memory chains: obs (3,) float32 = [time to live | query | bit], 2 actions.

    Time to live is bsuite's 1 - t / length (1 at the first step, 1/length at the last); the
    query flag is 1 on the steps whose action is judged; the bit is shown as +1 / -1 (bsuite's
    2c - 1) on the steps that show one and 0 elsewhere. Bits are drawn from the counter RNG at
    (episode, step), so the bit shown at step t is recomputed, not stored.
    """

    _task_arrays = ()
    num_actions = 2
    observation_spec = ArraySpec((3,), np.dtype(np.float32))

    def __init__(self, num_envs: int, seed: int, length: int):
        _check_length(length)
        self.length = length
        super().__init__(num_envs, seed)

    @property
    def episode_steps(self) -> int:
        return self.length

    def bit_at(self, steps: np.ndarray) -> np.ndarray:
        """The bit (B,) of 0/1 drawn for each stream's current episode at `steps` (B,)."""
        return hashed_ints(self.seeds, self.episode, np.maximum(steps, 0), 1, 2)

    def _begin_episodes(self, rows: np.ndarray) -> None:
        pass  # the bits are functions of (seed, episode, step)

    def _observe(self) -> np.ndarray:
        obs = np.empty((self.num_envs, 3), dtype=np.float32)
        obs[:, 0] = 1.0 - self.t / self.length
        obs[:, 1] = self._queried()
        obs[:, 2] = np.where(self._shown(), 2.0 * self.bit_at(self.t) - 1.0, 0.0)
        return obs

    def correct_action(self) -> np.ndarray:
        """The answer each stream's query asks for now (B,); meaningless where no query is."""
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._check_actions(actions)
        queried = self._queried()
        right = actions == self.correct_action()
        reward = np.where(queried, np.where(right, 1.0, -1.0), 0.0)
        self.t += 1
        terminated = self.t == self.length
        truncated = np.zeros(self.num_envs, dtype=bool)
        return self._finish_step(reward, terminated, truncated)


class MemoryChain(_Chain):
    """bsuite's memory_len with one bit: the context bit at step 0, the query at the last step.

    Episode t = 0 .. length-1: t = 0 shows the context (+1 / -1), the steps between show only
    the time to live, t = length-1 raises the query flag and its action is judged: +1 if it
    equals the context bit, -1 otherwise, then the episode terminates. Other actions are
    no-ops (reward 0). Memory span (context seen -> answer given) = length - 1 steps, as
    bsuite's memory_length (bsuite shows its first observation twice and lasts length + 1).
    """

    def __init__(self, num_envs: int, seed: int = 0, length: int = 32):
        super().__init__(num_envs, seed, length)

    def _queried(self) -> np.ndarray:
        return self.t == self.length - 1

    def _shown(self) -> np.ndarray:
        return self.t == 0

    def correct_action(self) -> np.ndarray:
        return self.bit_at(np.zeros_like(self.t))


class KMemoryChain(_Chain):
    """A fresh bit every step; from step k on, each step asks for the bit shown k steps earlier.

    Episode t = 0 .. length-1: every observation shows a new bit (+1 / -1); the action at step
    t >= k is judged against the bit of step t - k (+1 right, -1 wrong), steps t < k give 0
    (the query flag says which). The episode terminates after `length` steps, so an episode
    holds length - k queries. Memory span k steps, over a window of the last k bits.
    """

    def __init__(self, num_envs: int, seed: int = 0, k: int = 8, length: int = 64):
        _check_length(length)
        if not 1 <= k < length:
            raise ConfigError(
                f"k must be an integer in [1, length - 1] = [1, {length - 1}], got {k}"
            )
        self.k = k
        super().__init__(num_envs, seed, length)

    def _queried(self) -> np.ndarray:
        return self.t >= self.k

    def _shown(self) -> np.ndarray:
        return np.ones(self.num_envs, dtype=bool)

    def correct_action(self) -> np.ndarray:
        return self.bit_at(self.t - self.k)


BUILTIN_TASKS = {
    "delayed-cue": DelayedCue,
    "watermaze": Watermaze,
    "memory-chain": MemoryChain,
    "k-memory-chain": KMemoryChain,
}


def make_builtin(task: str, num_envs: int, seed: int = 0, **options: Any) -> BatchedEnv:
    """`builtin/<task>` for a task of BUILTIN_TASKS; options are the constructor's keywords."""
    if task not in BUILTIN_TASKS:
        raise ConfigError(f"unknown built-in task {task!r}; known: {sorted(BUILTIN_TASKS)}")
    check_options(BUILTIN_TASKS[task], f"builtin/{task}", options, fixed=2)
    return BUILTIN_TASKS[task](num_envs, seed, **options)
