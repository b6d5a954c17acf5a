"""What a streaming agent is to the runtime, the evaluation and the checkpoints: K agents in
lockstep, one update a step. Stream AC(lambda) (ac.py), QRC(lambda) (qrc.py) and intentional
Q(lambda) (intentional_q.py) implement it; another algorithm implements it and registers a
builder in build.py."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

from r2ac.rl.stream.nets import StackedNet


class StreamAgent(Protocol):
    k: int  # agents
    steps: int  # lockstep steps taken (the sampler's counter)
    frozen: bool  # no learning, normalisers frozen (evaluation)
    dtype: torch.dtype
    # metrics.csv's names of the (K,) fields of what `learn` returns, in order (the first's
    # mean absolute value is logged, the others' means)
    metric_names: tuple[str, ...]

    def observe_first(self, obs) -> None:
        """The first observation (K, ...) of every stream."""

    def act(self, greedy: bool = False) -> torch.Tensor:
        """Actions (K, *action_shape) at the current observation."""

    def learn(self, reward, obs, final_obs, terminated, truncated) -> NamedTuple:
        """One update from this step; the next observation becomes current."""

    def acting_net(self) -> tuple[StackedNet, torch.Tensor]:
        """The network that acts and its flat parameters (K, P)."""

    def nets(self) -> dict[str, tuple[StackedNet, torch.Tensor]]:
        """Every network by name with its flat parameters (K, P)."""

    def choose(self, out: torch.Tensor, u: torch.Tensor | None, greedy: bool) -> torch.Tensor:
        """Actions from the acting network's output (K, out) and uniforms u (K, draws())."""

    def draws(self) -> int:
        """Uniforms per agent a sampled action takes."""

    def restart_episodes(self) -> None:
        """Every agent's traces zeroed: its envs restart their episodes."""

    def finite(self) -> bool:
        """Whether every weight is finite."""

    def constant_metrics(self) -> dict[str, float]:
        """metrics.csv's columns that hold a setting (e.g. the step size)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything a step carries (weights, traces, core states, normalisers, counters)."""

    def load_state_dict(self, saved: dict[str, Any]) -> None: ...

    def weights(self) -> dict[str, torch.Tensor]:
        """The agents' weights and normalisers by name (agent.pt)."""
