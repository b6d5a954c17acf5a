"""The batched environment protocol every backend implements.

A `BatchedEnv` runs `num_envs` independent streams in lock-step. Its `action_space`
(r2ac/envs/spaces.py) says what one stream's action is: one int for a Discrete space (the
default, from `num_actions`), a vector of ints for MultiDiscrete/MultiBinary, a float vector
in normalised units for a Box (the env clips and scales it to its bounds).

Auto-reset (same-step, as in IMPALA/torchbeast). `step(actions)` returns, per stream,

    reward[b], terminated[b], truncated[b]  of the transition just taken with actions[b];
    obs[b]  the next observation, or, when that transition ended the episode
            (terminated[b] or truncated[b]), already the FIRST observation of the next
            episode.

So every action a learner sends is executed, and the observation following a `done` is the
start of a fresh episode (the recurrent state should be reset before consuming it). Backends
that reset one step late (envpool, which would drop the next action) hide it by resetting
the finished streams at once. `terminated` means the task ended (no bootstrap);
`truncated` means a time limit cut it (bootstrap from `info["final_obs"]` if wanted).

`info` always holds, as arrays over the batch:
    "episode_return"  float64 (B,)  return of the episode that just ended, NaN elsewhere;
    "episode_length"  int64   (B,)  its length in steps, 0 elsewhere;
    "final_obs"       like obs      the last observation of the ended episode in the rows of
                                    finished streams; equal to obs in the other rows (it is
                                    `obs` itself when no stream finished).

Rewards are raw (the learner clips). Observations are numpy arrays: images uint8 (C, H, W),
vectors float32 (D,).

Seeding: one integer seed drives all streams; per-stream seeds come from
`numpy.random.SeedSequence(seed).spawn(num_envs)` (see `stream_seeds`).
"""

from __future__ import annotations

import abc
import inspect
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one stream's observation (the batch adds a leading axis)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def is_image(self) -> bool:
        return len(self.shape) == 3 and np.dtype(self.dtype) == np.uint8


class StepResult(NamedTuple):
    """What `BatchedEnv.step` returns; every array has the batch axis first."""

    obs: np.ndarray  # (B, *obs_shape)
    reward: np.ndarray  # (B,) float32, raw
    terminated: np.ndarray  # (B,) bool
    truncated: np.ndarray  # (B,) bool
    info: dict[str, np.ndarray]


class FirstEpisodeCut:
    """Ends each stream's first episode after a random 1..max_steps steps, as a time limit
    (truncated: the learner bootstraps). Episodes of one fixed length L (RepeatPrevious: 51
    steps) otherwise keep every stream in step for the whole run, so that each batch holds
    one phase of the episode in all its streams (every episode's end in one batch of each
    L / M) and the gradients cycle with that phase. `start` draws anew (at every reset)."""

    def __init__(self, num_envs: int, max_steps: int, seed: int):
        if max_steps < 1:
            raise ConfigError(f"decorrelate steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.rng = np.random.default_rng([seed, 0xDEC0])
        self.left = np.zeros(num_envs, dtype=np.int64)  # (B,) steps until the cut; 0: none

    def start(self) -> None:
        self.left = self.rng.integers(1, self.max_steps + 1, size=self.left.shape)

    def __call__(self, ended: np.ndarray) -> np.ndarray:
        """After a step in which the `ended` (B,) streams finished on their own: the streams
        whose first episode is cut now (B,) bool."""
        running = self.left > 0
        self.left[running] -= 1
        cut = running & (self.left == 0) & ~ended
        self.left[ended] = 0  # an episode that ended on its own has done the decorrelating
        return cut

    def get_state(self) -> dict[str, Any]:
        return {"left": self.left.copy(), "rng": self.rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore get_state(); ConfigError naming the field for a value out of range, before
        anything changes."""
        left = saved_array(state, "left", self.left, 0, self.max_steps, "first_cut.")
        rng = np.random.default_rng()  # a throwaway generator of the same kind checks the form
        try:
            rng.bit_generator.state = _field(state, "rng", "first_cut.")
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"env state first_cut.rng: not a {type(rng.bit_generator).__name__} state ({exc})"
            ) from None
        self.left[:] = left
        self.rng.bit_generator.state = rng.bit_generator.state


class BatchedEnv(abc.ABC):
    """A batch of `num_envs` environment streams with same-step auto-reset."""

    num_envs: int
    observation_spec: ArraySpec
    num_actions: int
    # `decorrelate`: the backends that can end one stream's episode on its own say True and
    # call `_start_cuts` in `reset` and `_with_cuts` in `step`
    can_cut_episodes = False
    first_cut: FirstEpisodeCut | None = None

    def decorrelate(self, max_steps: int, seed: int) -> None:
        """From the next reset on, end each stream's first episode after a random 1..max_steps
        steps (`FirstEpisodeCut`; 0: never)."""
        if max_steps and not self.can_cut_episodes:
            raise ConfigError(
                f"--decorrelate-steps: {type(self).__name__} cannot end one stream's episode "
                "on its own (the built-in and gym/ envs can); leave it at 0"
            )
        self.first_cut = FirstEpisodeCut(self.num_envs, max_steps, seed) if max_steps else None

    def _start_cuts(self) -> None:
        if self.first_cut is not None:
            self.first_cut.start()

    def _with_cuts(self, terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
        """`truncated` (B,) with this step's cuts of first episodes added."""
        if self.first_cut is None:
            return truncated
        return truncated | self.first_cut(terminated | truncated)

    @property
    def action_space(self) -> ActionSpace:
        """Discrete(num_actions) unless a backend says otherwise."""
        return ActionSpace.discrete(self.num_actions)

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start a new episode in every stream; returns obs (B, *obs_shape).

        With a seed, every stream is re-seeded from it (as `make(..., seed)` does);
        without, the streams continue their own random sequences.
        """

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> StepResult:
        """Apply actions (B, *action_space.action_shape); see the module docstring for the
        reset semantics."""

    def get_state(self) -> dict[str, Any]:
        """A picklable snapshot from which `set_state` resumes bit-exactly."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot snapshot its simulator state; "
            "resume it with a fresh reset instead"
        )

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a snapshot taken by `get_state`."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot restore a simulator state; "
            "resume it with a fresh reset instead"
        )

    def close(self) -> None:  # noqa: B027  (optional hook, most backends hold nothing)
        """Release simulator resources (no-op by default)."""

    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},), got {actions.shape}")
        if actions.size and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise ValueError(f"actions must lie in [0, {self.num_actions}), got {actions}")
        return actions.astype(np.int64, copy=False)


def stream_seeds(seed: int, num_envs: int) -> np.ndarray:
    """Independent per-stream seeds (num_envs,) uint32 derived from one seed."""
    children = np.random.SeedSequence(seed).spawn(num_envs)
    return np.array([child.generate_state(1)[0] for child in children], dtype=np.uint32)


class EpisodeStats:
    """Running return and length per stream; fills the episode_* info arrays."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)  # (B,)
        self.lengths = np.zeros(num_envs, dtype=np.int64)  # (B,)

    def reset(self) -> None:
        self.returns[:] = 0.0
        self.lengths[:] = 0

    def update(self, reward: np.ndarray, done: np.ndarray) -> dict[str, np.ndarray]:
        """Add one step; returns episode_return/episode_length for the streams that ended."""
        self.returns += reward
        self.lengths += 1
        episode_return = np.where(done, self.returns, np.nan)
        episode_length = np.where(done, self.lengths, 0)
        self.returns[done] = 0.0
        self.lengths[done] = 0
        return {"episode_return": episode_return, "episode_length": episode_length}

    def get_state(self) -> dict[str, np.ndarray]:
        return {"returns": self.returns.copy(), "lengths": self.lengths.copy()}

    def set_state(self, state: dict[str, np.ndarray], max_length: int | None = None) -> None:
        """Restore get_state() (lengths at most `max_length`); ConfigError naming the field
        for a value out of range, before anything changes."""
        returns = saved_array(state, "returns", self.returns, prefix="stats.")
        lengths = saved_array(state, "lengths", self.lengths, 0, max_length, "stats.")
        self.returns[:], self.lengths[:] = returns, lengths


def _field(state: Any, name: str, prefix: str = "") -> Any:
    if not isinstance(state, dict) or name not in state:
        raise ConfigError(f"env state {prefix}{name}: missing")
    return state[name]


def saved_array(
    state: Any,
    name: str,
    like: np.ndarray,
    low: int | None = None,
    high: int | None = None,
    prefix: str = "",
) -> np.ndarray:
    """state[name] as an array of like's shape and dtype, checked: integers (for an integer
    `like`) in low..high, or finite floats; ConfigError naming the field otherwise. Saved env
    states come from files, so every value is checked before an env takes it."""
    field = f"env state {prefix}{name}"
    try:
        value = np.asarray(_field(state, name, prefix))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{field}: not an array ({exc})") from None
    if value.shape != like.shape:
        raise ConfigError(f"{field}: shape {value.shape}, expected {like.shape}")
    integer = like.dtype.kind in "iu"
    if value.dtype.kind not in ("iu" if integer else "iuf"):
        raise ConfigError(f"{field}: dtype {value.dtype}, expected {like.dtype}")
    if not integer:
        if not np.isfinite(value).all():
            raise ConfigError(f"{field}: a non-finite value")
        return value.astype(like.dtype)
    for bound, bad in ((low, value < low), (high, value > high)):
        if bound is not None and bad.any():
            b = int(np.flatnonzero(bad)[0])
            span = f"{'' if low is None else low}..{'' if high is None else high}"
            raise ConfigError(f"{field}: {int(value[b])} at stream {b}, expected {span}")
    return value.astype(like.dtype)


def merge_final_obs(final_obs: np.ndarray, reset_obs: np.ndarray, done: np.ndarray):
    """Returns (obs, final_obs): obs with reset rows put in place of the finished ones.

    final_obs: (B, ...) the observations the backend returned for the transition;
    reset_obs: (num_done, ...) first observations of the new episodes, in stream order.
    """
    if not done.any():
        return final_obs, final_obs
    obs = final_obs.copy()
    obs[done] = reset_obs
    return obs, final_obs


def check_options(factory, name: str, options: dict[str, Any], fixed: int = 3) -> None:
    """ConfigError unless every option is a keyword parameter of factory (after the first
    `fixed` positional ones); a factory with **kwargs validates its own options."""
    bad = [
        f"{k}={v!r}" for k, v in options.items() if isinstance(v, float) and not math.isfinite(v)
    ]
    if bad:
        raise ConfigError(f"env options must be finite: {', '.join(bad)}")
    parameters = list(inspect.signature(factory).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    known = sorted(p.name for p in parameters[fixed:])
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"unknown options {unknown} for {name}; known: {known}")
    by_name = {p.name: p for p in parameters}
    bad = [
        f"{k}={v!r} (expected {kind})"
        for k, v in options.items()
        if (kind := _option_type(by_name[k])) and not _fits(v, kind)
    ]
    if bad:
        raise ConfigError(f"env options of the wrong type for {name}: {', '.join(bad)}")


_OPTION_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _option_type(parameter: inspect.Parameter) -> str | None:
    """The type an option must have: its default's (int, float, str, bool), else its
    annotation's when that is one of these; None (unchecked) otherwise."""
    default = parameter.default
    if type(default) in _OPTION_TYPES.values():
        return type(default).__name__
    annotation = parameter.annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return name if name in _OPTION_TYPES else None


def _fits(value: Any, kind: str) -> bool:
    if kind == "float":  # an int is a float too; bools are not numbers here
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _OPTION_TYPES[kind])
