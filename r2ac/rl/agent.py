"""The R2AC agent: stem -> core([features, clipped last reward]) -> policy and value heads."""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from r2ac.errors import ConfigError
from r2ac.rl import checkpoint
from r2ac.rl.nets import PolicyValueHeads
from r2ac.rtrl import RecurrentCore

STEM_PREFIX = "stem."


class Agent(nn.Module):
    """Actor-critic network around any `r2ac.rtrl.RecurrentCore`.

    ``stem`` maps ``(N, *obs_shape)`` to ``(N, stem.out_features)``; ``core`` maps
    ``(T, B, stem.out_features + 1)`` to ``(T, B, core.hidden_size)``. With ``freeze_stem``
    the stem gets no gradients (its parameters are frozen and it runs under ``no_grad``).
    """

    def __init__(
        self, stem: nn.Module, core: RecurrentCore, num_actions: int, freeze_stem: bool = False
    ):
        super().__init__()
        if not isinstance(core, RecurrentCore):
            raise ConfigError(f"core {type(core).__name__} is not an r2ac.rtrl.RecurrentCore")
        hidden_size, input_size = core.hidden_size, core.input_size
        if input_size != stem.out_features + 1:
            raise ConfigError(
                f"core input_size {input_size} != stem features {stem.out_features} + 1 "
                "(the clipped last reward)"
            )
        self.stem = stem
        self.core = core
        self.heads = PolicyValueHeads(hidden_size, num_actions)
        self.freeze_stem = freeze_stem
        if freeze_stem:
            self.stem.requires_grad_(False)

    def initial_state(self, batch_size: int) -> Any:
        return self.core.initial_state(batch_size)

    def forward(
        self,
        obs: torch.Tensor,
        last_reward: torch.Tensor,
        reset: torch.Tensor | None,
        state: Any,
        carry: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """obs ``(T, B, *obs_shape)``, last_reward ``(T, B)``, reset ``(T, B)`` bool or None.

        Returns logits ``(T, B, A)``, values ``(T, B)`` and the core's new state. The last
        reward is clipped to [-1, 1] and zeroed where ``reset`` is set (a new episode has no
        previous reward), so a reset stream sees exactly what a fresh stream sees.
        `carry=False` tells the core the returned state will not be used (cores that can,
        `core.skips_carry`, skip their sensitivity carry; the returned state is then incomplete).
        """
        x = self.core_input(obs, last_reward, reset)  # (T, B, F + 1)
        h, state = self.core(x, state, reset=reset, carry=carry)  # (T, B, N)
        logits, values = self.heads(h)  # (T, B, A), (T, B)
        return logits, values, state

    def core_input(
        self, obs: torch.Tensor, last_reward: torch.Tensor, reset: torch.Tensor | None
    ) -> torch.Tensor:
        """The core's input ``(T, B, F + 1)``: stem features and the clipped last reward.

        Actors record it to recompute the carried core state of a segment in one call.
        """
        if last_reward.dim() != 2 or obs.shape[:2] != last_reward.shape:
            raise ValueError(
                f"obs must be (T, B, ...) and last_reward (T, B); got {tuple(obs.shape)} "
                f"and {tuple(last_reward.shape)}"
            )
        if reset is not None and reset.shape != last_reward.shape:
            raise ValueError(f"reset must be (T, B); got {tuple(reset.shape)}")
        n_steps, batch_size = last_reward.shape
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_stem):
            features = self.stem(obs.flatten(0, 1))  # (T * B, F)
        features = features.reshape(n_steps, batch_size, -1)  # (T, B, F)
        r_tm1 = last_reward.to(features.dtype).clamp(-1.0, 1.0)  # (T, B)
        if reset is not None:
            r_tm1 = r_tm1.masked_fill(reset.bool(), 0.0)
        x = torch.cat([features, r_tm1.unsqueeze(-1)], dim=-1)  # (T, B, F + 1)
        return x

    def load_stem(self, path: str | os.PathLike) -> None:
        """Load the stem's weights from a checkpoint of an agent (e.g. a pre-trained one).

        The file holds an agent ``state_dict`` or a mapping with it under ``"agent"``; only
        the ``stem.*`` entries are used. Missing, unexpected or mis-shaped keys raise
        ConfigError, as do a missing file and one that is not a weights-only checkpoint.
        A frozen stem stays frozen.
        """
        try:
            obj = checkpoint.load(path)
        except (FileNotFoundError, pickle.UnpicklingError) as exc:
            raise ConfigError(f"cannot load stem weights from {path}: {exc}") from exc
        if isinstance(obj, Mapping) and isinstance(obj.get("agent"), Mapping):
            obj = obj["agent"]
        if not isinstance(obj, Mapping):
            raise ConfigError(f"{path}: expected an agent state_dict, got {type(obj).__name__}")
        loaded = {k[len(STEM_PREFIX) :]: v for k, v in obj.items() if k.startswith(STEM_PREFIX)}
        expected = self.stem.state_dict()
        problems = [f"missing {k}" for k in expected if k not in loaded]
        problems += [f"unexpected {k}" for k in loaded if k not in expected]
        problems += [
            f"{k}: checkpoint {tuple(v.shape)} != model {tuple(expected[k].shape)}"
            for k, v in loaded.items()
            if k in expected and v.shape != expected[k].shape
        ]
        if problems:
            shown = "; ".join(problems[:8]) + (
                f"; ... ({len(problems)} in all)" if len(problems) > 8 else ""
            )
            raise ConfigError(f"{path}: stem weights do not fit: {shown}")
        self.stem.load_state_dict(loaded)
