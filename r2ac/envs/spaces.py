"""Action spaces of the batched-env protocol: what the agent's policy head must produce.

`ActionSpace` is a small frozen (picklable) description, independent of Gymnasium:

    kind            actions per stream             head outputs (params)   prev-action code
    discrete        ()    int64 in [0, n)          n logits                one-hot, n
    multi_discrete  (K,)  int64, a_k in [0, n_k)   sum n_k logits          K one-hots, sum n_k
    multi_binary    (K,)  int64 in {0, 1}          K Bernoulli logits      the bits, K
    box             (D,)  float, normalised units  D means + D log-stds    clip(a, -1, 1), D

Box actions live in normalised units: the env maps a in [-1, 1] to [low, high] (affinely)
after clipping to [-1, 1] (`box_to_env`); a dimension with an infinite bound is passed
through unscaled and unclipped. The policy's Gaussian is over the unclipped action, which is
what the segment stores (r2ac/rl/model/distributions.py says why clipping rather than tanh).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from r2ac.errors import ConfigError

KINDS = ("discrete", "multi_discrete", "multi_binary", "box")


@dataclass(frozen=True)
class ActionSpace:
    kind: str
    nvec: tuple[int, ...] = ()  # categories per component (discrete: (n,); binary: 2s)
    low: tuple[float, ...] = ()  # box bounds per dimension (may be -inf)
    high: tuple[float, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"unknown action space kind {self.kind!r}")
        if self.kind != "box" and (not self.nvec or min(self.nvec) < 1):
            raise ConfigError(f"{self.kind} action space needs category counts >= 1")
        if self.kind == "box" and (not self.low or len(self.low) != len(self.high)):
            raise ConfigError("box action space needs equal-length low and high bounds")

    @staticmethod
    def discrete(n: int) -> ActionSpace:
        return ActionSpace("discrete", (int(n),))

    @staticmethod
    def multi_discrete(nvec) -> ActionSpace:
        return ActionSpace("multi_discrete", tuple(int(n) for n in nvec))

    @staticmethod
    def multi_binary(n: int) -> ActionSpace:
        return ActionSpace("multi_binary", (2,) * int(n))

    @staticmethod
    def box(low, high) -> ActionSpace:
        return ActionSpace("box", low=tuple(map(float, low)), high=tuple(map(float, high)))

    @property
    def dims(self) -> int:
        """Action components: 1 for discrete, K or D otherwise."""
        return len(self.low) if self.kind == "box" else len(self.nvec)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """One stream's action: () for discrete, (K,) or (D,) otherwise."""
        return () if self.kind == "discrete" else (self.dims,)

    @property
    def is_float(self) -> bool:
        return self.kind == "box"

    @property
    def head_size(self) -> int:
        """Width of the policy head's linear layer (Box: the means only)."""
        if self.kind in ("box", "multi_binary"):
            return self.dims
        return sum(self.nvec)

    @property
    def param_size(self) -> int:
        """Distribution parameters per step (Box: means and the log-std parameter)."""
        return 2 * self.dims if self.kind == "box" else self.head_size

    @property
    def code_size(self) -> int:
        """Width of the previous-action code in the core input."""
        return self.head_size

    def describe(self) -> str:
        if self.kind == "box":
            return f"Box({self.dims})"
        if self.kind == "discrete":
            return f"Discrete({self.nvec[0]})"
        if self.kind == "multi_binary":
            return f"MultiBinary({self.dims})"
        return f"MultiDiscrete({list(self.nvec)})"


def as_action_space(space: ActionSpace | int) -> ActionSpace:
    """An int is the number of actions of a Discrete space (the pre-space API)."""
    return space if isinstance(space, ActionSpace) else ActionSpace.discrete(space)


def box_to_env(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Normalised actions (B, D) -> env units: clip to [-1, 1], map affinely to [low, high];
    dimensions with an infinite bound pass through as they are."""
    finite = np.isfinite(low) & np.isfinite(high)  # (D,)
    lo, hi = np.where(finite, low, -1.0), np.where(finite, high, 1.0)  # no inf arithmetic
    scaled = lo + (np.clip(actions, -1.0, 1.0) + 1.0) * 0.5 * (hi - lo)  # (B, D)
    return np.where(finite, scaled, actions)


def check_actions(space: ActionSpace, actions, num_envs: int) -> np.ndarray:
    """ValueError unless `actions` is (B, *action_shape) and in range; returns int64 (or
    float64 for a Box) actions."""
    actions = np.asarray(actions)
    if actions.shape != (num_envs, *space.action_shape):
        raise ValueError(
            f"actions must have shape {(num_envs, *space.action_shape)}, got {actions.shape}"
        )
    if space.is_float:
        if not np.isfinite(actions).all():
            raise ValueError("box actions must be finite")
        return actions.astype(np.float64, copy=False)
    if actions.size and (actions.min() < 0 or (actions >= np.asarray(space.nvec)).any()):
        bound = space.nvec[0] if space.kind == "discrete" else list(space.nvec)
        raise ValueError(f"actions must lie in [0, {bound}), got {actions}")
    return actions.astype(np.int64, copy=False)


def from_gym(space, env_id: str) -> tuple[ActionSpace, tuple[int, ...], int]:
    """A Gymnasium action space -> (ActionSpace, the env's own action shape, Discrete's start).

    Multi-dimensional MultiDiscrete/MultiBinary/Box spaces are flattened (the adapter reshapes
    the actions back). Anything else is refused with one line naming the space."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return ActionSpace.discrete(space.n), (), int(space.start)
    if isinstance(space, spaces.MultiDiscrete) and not np.any(getattr(space, "start", 0)):
        return ActionSpace.multi_discrete(np.ravel(space.nvec)), space.shape, 0
    if isinstance(space, spaces.MultiBinary):
        return ActionSpace.multi_binary(int(np.prod(space.shape))), space.shape, 0
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return ActionSpace.box(np.ravel(space.low), np.ravel(space.high)), space.shape, 0
    raise ConfigError(
        f"{env_id}: action space {space} is not supported (Discrete, MultiDiscrete, "
        "MultiBinary and float Box are)"
    )
