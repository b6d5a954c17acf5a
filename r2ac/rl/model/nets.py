"""Feature stems and policy/value heads for the agent.

Pure ``nn.Module`` s built from sizes only (no config objects). Stems map a batch of
observations ``(N, *obs_shape)`` to features ``(N, out_features)``; every stem ends in a ReLU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from r2ac.errors import ConfigError
from r2ac.rl.config import IMAGE_STEMS


def _pooled_size(size: int) -> int:
    """Output length of a 3x3 max-pool with stride 2 and padding 1: ceil(size / 2)."""
    return (size - 1) // 2 + 1


def _conv_size(size: int, kernel: int, stride: int) -> int:
    """Output length of an unpadded convolution."""
    return (size - kernel) // stride + 1


def _check_images(obs: torch.Tensor, shape: tuple[int, ...]) -> None:
    if obs.dim() != 4 or tuple(obs.shape[1:]) != shape:
        raise ValueError(
            f"expected uint8 images (N, {', '.join(map(str, shape))}); got shape {tuple(obs.shape)}"
        )
    if obs.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images; got dtype {obs.dtype}")


class _ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), channel count unchanged."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv0(torch.relu(x))
        y = self.conv1(torch.relu(y))
        return x + y


class _ConvStage(nn.Module):
    """conv3x3 -> max-pool 3x3 stride 2 -> two residual blocks."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.res0 = _ResidualBlock(out_channels)
        self.res1 = _ResidualBlock(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res1(self.res0(self.pool(self.conv(x))))


class ImpalaResNetStem(nn.Module):
    """The IMPALA "deep" ResNet stem for uint8 images ``(N, C, H, W)``, scaled by 1/255 inside.

    Three conv stages, ReLU, flatten, Linear to ``out_features``, ReLU.
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        channels: Sequence[int] = (16, 32, 32),
        out_features: int = 256,
    ):
        super().__init__()
        self.observation_shape = (in_channels, height, width)
        self.out_features = out_features
        stages, c_in = [], in_channels
        for c_out in channels:
            stages.append(_ConvStage(c_in, c_out))
            c_in = c_out
            height, width = _pooled_size(height), _pooled_size(width)
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c_in * height * width, out_features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        _check_images(obs, self.observation_shape)
        x = obs.to(self.fc.weight.dtype) / 255.0  # (N, C, H, W)
        x = torch.relu(self.stages(x))  # (N, C', H', W')
        return torch.relu(self.fc(x.flatten(1)))  # (N, out_features)


class ShallowConvStem(nn.Module):
    """The IMPALA paper's "shallow" stem (Nature-DQN style) for uint8 images ``(N, C, H, W)``.

    conv 16x8x8 stride 4, ReLU, conv 32x4x4 stride 2, ReLU, flatten, Linear to
    ``out_features``, ReLU; scaled by 1/255 inside. On 84x84 Atari frames its convolutions
    take 2.3 M multiply-adds against the ResNet's 53 M, which makes Atari trainable on a CPU.
    """

    def __init__(self, in_channels: int, height: int, width: int, out_features: int = 256):
        super().__init__()
        self.observation_shape = (in_channels, height, width)
        self.out_features = out_features
        self.conv0 = nn.Conv2d(in_channels, 16, kernel_size=8, stride=4)
        self.conv1 = nn.Conv2d(16, 32, kernel_size=4, stride=2)
        out_h, out_w = (_conv_size(_conv_size(n, 8, 4), 4, 2) for n in (height, width))
        if out_h < 1 or out_w < 1:
            raise ConfigError(f"images of {height}x{width} are too small for the shallow stem")
        self.fc = nn.Linear(32 * out_h * out_w, out_features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        _check_images(obs, self.observation_shape)
        x = obs.to(self.fc.weight.dtype) / 255.0  # (N, C, H, W)
        x = torch.relu(self.conv1(torch.relu(self.conv0(x))))  # (N, 32, H', W')
        return torch.relu(self.fc(x.flatten(1)))  # (N, out_features)


class MLPStem(nn.Module):
    """Linear + ReLU layers for flat float observations ``(N, in_features)``."""

    def __init__(self, in_features: int, hidden: Sequence[int] = (256,), out_features: int = 256):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        sizes = [in_features, *hidden, out_features]
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.layers = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.dim() != 2 or obs.shape[1] != self.in_features:
            raise ValueError(f"expected (N, {self.in_features}); got shape {tuple(obs.shape)}")
        return self.layers(obs.to(self.layers[0].weight.dtype))  # (N, out_features)


def _numpy_dtype(dtype) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        return torch.empty(0, dtype=dtype).numpy().dtype
    return np.dtype(dtype)


def make_stem(
    observation_shape: Sequence[int],
    dtype,
    out_features: int = 256,
    channels: Sequence[int] = (16, 32, 32),
    mlp_hidden: Sequence[int] = (256,),
    image_stem: str = "resnet",
) -> nn.Module:
    """An image stem for 3-D uint8 observations, the MLP stem for 1-D float ones.

    ``image_stem`` picks the image stem: one of IMAGE_STEMS ("resnet", the paper's; "shallow",
    IMPALA's cheap one). ``dtype`` is a torch or numpy dtype (or its name). Anything else
    raises ConfigError.
    """
    if image_stem not in IMAGE_STEMS:
        raise ConfigError(
            f"unknown image stem {image_stem!r}; choose one of {', '.join(IMAGE_STEMS)}"
        )
    shape = tuple(int(n) for n in observation_shape)
    try:
        np_dtype = _numpy_dtype(dtype)
    except TypeError as exc:
        raise ConfigError(f"unknown observation dtype {dtype!r}") from exc
    if len(shape) == 3 and np_dtype == np.uint8:
        if image_stem == "shallow":
            return ShallowConvStem(*shape, out_features=out_features)
        return ImpalaResNetStem(*shape, channels=channels, out_features=out_features)
    if len(shape) == 1 and np.issubdtype(np_dtype, np.floating):
        return MLPStem(shape[0], hidden=mlp_hidden, out_features=out_features)
    raise ConfigError(
        f"no stem for observations of shape {shape} and dtype {np_dtype}: expected "
        "uint8 images (C, H, W) or flat float vectors (D,)"
    )


class PolicyValueHeads(nn.Module):
    """Linear policy logits and a linear baseline on core outputs ``(..., in_features)``,
    optionally after one shared ReLU layer of width ``hidden`` (0: none).

    With ``value_norm`` the baseline is PopArt-normalised (van Hasselt et al. 2016; Hessel et
    al. 2019, "Multi-task deep RL with PopArt"): the linear layer predicts a normalised value
    n, and ``forward`` returns ``V = sigma * n + mu`` with running statistics of the value
    targets kept as buffers (so they travel with the weights and the checkpoints).
    ``update_value_stats`` moves the statistics and rescales the layer so that V is unchanged
    ("preserving outputs precisely"); the learner divides the value error and the advantages
    by ``value_scale()``, which makes the losses invariant to the reward scale.

    ``log_std`` > 0 (a Box action space of that many dimensions) adds a state-independent
    log-std parameter (initialised to 0) that ``forward`` appends to the policy outputs, so
    that they are the whole Gaussian's parameters (r2ac/rl/model/distributions.py).
    """

    SIGMA_RANGE = (1e-4, 1e6)

    def __init__(
        self,
        in_features: int,
        num_actions: int,
        value_norm: bool = False,
        hidden: int = 0,
        log_std: int = 0,
    ):
        super().__init__()
        self.torso = (
            nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU()) if hidden else nn.Identity()
        )
        width = hidden or in_features
        self.policy = nn.Linear(width, num_actions)
        self.baseline = nn.Linear(width, 1)
        if log_std:
            self.log_std = nn.Parameter(torch.zeros(log_std))
        self.value_norm = value_norm
        if value_norm:
            self.register_buffer("value_mean", torch.zeros(()))  # mu: E[target]
            self.register_buffer("value_sq_mean", torch.ones(()))  # nu: E[target^2]

    def value_scale(self) -> torch.Tensor:
        """sigma = sqrt(nu - mu^2), clipped; 1 without value normalisation."""
        if not self.value_norm:
            return torch.ones((), dtype=self.baseline.weight.dtype)
        variance = self.value_sq_mean - self.value_mean**2
        return variance.clamp(min=self.SIGMA_RANGE[0] ** 2).sqrt().clamp(*self.SIGMA_RANGE)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns logits ``(..., num_actions)`` (with the log-stds appended: ``(..., 2D)``)
        and values ``(...)`` (unnormalised)."""
        features = self.torso(h)  # (..., width)
        values = self.baseline(features).squeeze(-1)  # (...)
        if self.value_norm:
            values = values * self.value_scale() + self.value_mean
        return self._policy_params(features), values  # (..., P), (...)

    def _policy_params(self, features: torch.Tensor) -> torch.Tensor:
        params = self.policy(features)  # (..., A)
        if hasattr(self, "log_std"):
            params = torch.cat([params, self.log_std.expand_as(params)], dim=-1)  # (..., 2D)
        return params

    @torch.no_grad()
    def update_value_stats(self, targets: torch.Tensor, beta: float) -> None:
        """Move mu, nu toward the moments of `targets` (any shape) by step `beta`, then
        rescale the baseline layer so that every value it outputs stays the same."""
        if not self.value_norm:
            raise RuntimeError("update_value_stats needs value_norm=True")
        targets = targets.to(self.value_mean.dtype)
        sigma, mu = self.value_scale(), self.value_mean.clone()
        self.value_mean.lerp_(targets.mean(), beta)
        self.value_sq_mean.lerp_((targets**2).mean(), beta)
        new_sigma = self.value_scale()
        self.baseline.weight.mul_(sigma / new_sigma)
        self.baseline.bias.mul_(sigma).add_(mu - self.value_mean).div_(new_sigma)
