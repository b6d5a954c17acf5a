"""The R2AC agent: stem -> core([features, last reward, previous action]) -> policy and value heads.

The core input per step is the stem's features, the clipped last reward (``reward_clip``,
times the reward scale; left out with ``feed_last_reward=False``, as masked control tasks
need) and, with ``prev_action``, a code of the previous action (zeros at an episode start),
as POPGym's baselines feed it: one-hot per categorical, the normalised action clipped to
[-1, 1] for a Box (``r2ac.rl.model.distributions.action_code``). With ``value_norm`` the value head
is PopArt-normalised (``r2ac.rl.model.nets.PolicyValueHeads``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from r2ac.envs.spaces import ActionSpace, as_action_space
from r2ac.errors import ConfigError
from r2ac.rl.model.distributions import action_code, distribution
from r2ac.rl.model.nets import PolicyValueHeads
from r2ac.rl.model.obs_norm import RunningObsNorm
from r2ac.rtrl import RecurrentCore
from r2ac.runs import checkpoint
from r2ac.runs.schema import WEIGHTS_FILE

STEM_PREFIX = "stem."


def clip_rewards(rewards: torch.Tensor, clip: float) -> torch.Tensor:
    """Rewards clipped to [-clip, clip]; ``clip`` 0: unclipped (same shape)."""
    return rewards.clamp(-clip, clip) if clip > 0 else rewards


def core_input_size(
    stem_features: int, actions: ActionSpace | int, prev_action: bool, last_reward: bool = True
) -> int:
    """Width of the core input: features, the last reward, the previous action's code."""
    code = as_action_space(actions).code_size if prev_action else 0
    return stem_features + int(last_reward) + code


class Agent(nn.Module):
    """Actor-critic network around any `r2ac.rtrl.RecurrentCore`.

    ``stem`` maps ``(N, *obs_shape)`` to ``(N, stem.out_features)``; ``core`` maps
    ``(T, B, core_input_size(...))`` to ``(T, B, core.hidden_size)``. With ``freeze_stem``
    the stem gets no gradients (its parameters are frozen and it runs under ``no_grad``).
    ``reward_scale`` multiplies the last reward of the input, clipped to
    [-reward_clip, reward_clip] (0: unclipped; the losses see the same clip and scale).
    ``head_hidden`` > 0 puts a shared ReLU layer between core and heads (`PolicyValueHeads`).
    ``num_actions`` is an `ActionSpace` (an int: Discrete with that many actions); the policy
    head outputs its distribution's parameters (`distribution`). ``stem_norm`` puts a
    LayerNorm (with its affine gain and bias) on the stem's features before the core, so
    their scale stays O(1) whatever the stem learns (docs/rl.md, "The stem's scale").
    """

    def __init__(
        self,
        stem: nn.Module,
        core: RecurrentCore,
        num_actions: ActionSpace | int,
        freeze_stem: bool = False,
        prev_action: bool = False,
        value_norm: bool = False,
        reward_scale: float = 1.0,
        head_hidden: int = 0,
        reward_clip: float = 1.0,
        feed_last_reward: bool = True,
        stem_norm: bool = False,
        obs_norm: bool = False,
    ):
        super().__init__()
        if not isinstance(core, RecurrentCore):
            raise ConfigError(f"core {type(core).__name__} is not an r2ac.rtrl.RecurrentCore")
        hidden_size, input_size = core.hidden_size, core.input_size
        space = as_action_space(num_actions)
        expected = core_input_size(stem.out_features, space, prev_action, feed_last_reward)
        if input_size != expected:
            raise ConfigError(
                f"core input_size {input_size} != {expected} (stem features "
                f"{stem.out_features}"
                + (" + 1 last reward" if feed_last_reward else "")
                + (f" + {space.code_size} previous-action codes)" if prev_action else ")")
            )
        self.stem = stem
        self.core = core
        self.heads = PolicyValueHeads(
            hidden_size,
            space.head_size,
            value_norm=value_norm,
            hidden=head_hidden,
            log_std=space.dims if space.is_float else 0,
        )
        self.action_space = space
        self.num_actions = space.head_size
        self.prev_action = prev_action
        self.feed_last_reward = feed_last_reward
        self.reward_scale = reward_scale
        self.reward_clip = reward_clip
        self.freeze_stem = freeze_stem
        if freeze_stem:
            self.stem.requires_grad_(False)
        # registered only when asked: without it the parameters and checkpoints are as before
        self.stem_norm = nn.LayerNorm(stem.out_features) if stem_norm else None
        # --obs-norm: running statistics of the learner's batches (flat float obs only)
        self.obs_norm = None
        if obs_norm:
            if not hasattr(stem, "in_features"):
                raise ConfigError("--obs-norm needs flat float observations (the MLP stem)")
            self.obs_norm = RunningObsNorm(stem.in_features)

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> Any:
        return self.core.initial_state(batch_size, with_sensitivities)

    def forward(
        self,
        obs: torch.Tensor,
        last_reward: torch.Tensor,
        reset: torch.Tensor | None,
        state: Any,
        carry: bool = True,
        last_action: torch.Tensor | None = None,
    ) -> tuple[Any, ...]:
        """obs ``(T, B, *obs_shape)``, last_reward ``(T, B)``, reset ``(T, B)`` bool or None,
        last_action ``(T, B, *action_shape)`` (the action taken before obs[t]; needed with
        prev_action).

        Returns the policy's distribution parameters ("logits") ``(T, B, P)``, values ``(T, B)`` and the core's new state. The last
        reward and action are zeroed where ``reset`` is set (a new episode has neither), so a
        reset stream sees exactly what a fresh stream sees.
        `carry=False` tells the core the returned state will not be used (cores that can,
        `core.skips_carry`, skip their sensitivity carry; the returned state is then incomplete).
        """
        x = self.core_input(obs, last_reward, reset, last_action)  # (T, B, D)
        h, state = self.core(x, state, reset=reset, carry=carry)  # (T, B, N)
        logits, values = self.heads(h)  # (T, B, A), (T, B)
        return logits, values, state

    def core_input(
        self,
        obs: torch.Tensor,
        last_reward: torch.Tensor,
        reset: torch.Tensor | None,
        last_action: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The core's input ``(T, B, D)``: stem features, the clipped and scaled last reward
        and, with prev_action, the previous action's code (D = F + 1 [+ code_size]).

        Actors compute it step by step and pass it to `core.act`.
        """
        if last_reward.dim() != 2 or obs.shape[:2] != last_reward.shape:
            raise ValueError(
                f"obs must be (T, B, ...) and last_reward (T, B); got {tuple(obs.shape)} "
                f"and {tuple(last_reward.shape)}"
            )
        if reset is not None and reset.shape != last_reward.shape:
            raise ValueError(f"reset must be (T, B); got {tuple(reset.shape)}")
        expected = (*last_reward.shape, *self.action_space.action_shape)
        if last_action is not None and tuple(last_action.shape) != expected:
            dims = "".join(f", {n}" for n in self.action_space.action_shape)
            raise ValueError(
                f"last_action must be (T, B{dims}) = {expected}; got {tuple(last_action.shape)}"
            )
        n_steps, batch_size = last_reward.shape
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)  # (T, B, D)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_stem):
            features = self.stem(obs.flatten(0, 1))  # (T * B, F)
        features = features.reshape(n_steps, batch_size, -1)  # (T, B, F)
        if self.stem_norm is not None:
            features = self.stem_norm(features)
        parts = [features]
        if self.feed_last_reward:
            r_tm1 = clip_rewards(last_reward.to(features.dtype), self.reward_clip)  # (T, B)
            r_tm1 = r_tm1 * self.reward_scale  # (T, B)
            if reset is not None:
                r_tm1 = r_tm1.masked_fill(reset.bool(), 0.0)
            parts.append(r_tm1.unsqueeze(-1))
        if self.prev_action:
            parts.append(self._action_code(last_action, reset, features.dtype))
        return torch.cat(parts, dim=-1)  # (T, B, D)

    def _action_code(
        self, last_action: torch.Tensor | None, reset: torch.Tensor | None, dtype
    ) -> torch.Tensor:
        """The previous action's code ``(T, B, C)``, zeros where an episode starts."""
        if last_action is None:
            raise ValueError("this agent feeds the previous action: pass last_action (T, B, ...)")
        code = action_code(self.action_space, last_action, dtype)  # (T, B, C)
        if reset is not None:
            code = code.masked_fill(reset.bool().unsqueeze(-1), 0.0)
        return code

    def distribution(self, params: torch.Tensor):
        """The action distribution of the policy outputs ``(..., P)``."""
        return distribution(self.action_space, params)

    def load_stem(self, path: str | os.PathLike) -> None:
        """Load the stem's weights from a checkpoint of an agent (e.g. a pre-trained one).

        The file holds an agent ``state_dict`` or a mapping with it under ``"agent"``; only
        the ``stem.*`` entries are used. Missing, unexpected or mis-shaped keys raise
        ConfigError, as do a missing file and one that is not a weights-only checkpoint.
        A frozen stem stays frozen.
        """
        try:
            obj = checkpoint.load(path, expect=WEIGHTS_FILE, what="weights file")
        except (FileNotFoundError, checkpoint.CheckpointError) as exc:
            raise ConfigError(f"cannot load stem weights from {path}: {exc}") from exc
        if isinstance(obj.get("agent"), Mapping):
            obj = obj["agent"]
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
        from r2ac.runs.values import ValueMismatch, check_weights

        try:
            check_weights(loaded, expected, "stem")
        except ValueMismatch as exc:
            raise ConfigError(f"{path}: stem weights do not fit: {exc}") from exc
        self.stem.load_state_dict(loaded)
