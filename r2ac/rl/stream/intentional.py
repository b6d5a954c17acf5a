"""Intentional updates (Sharifnassab, Elsayed, De Asis, Mahmood & Sutton 2026; docs/rules/
intentional.md): the step size is solved for from the change the update intends, not bounded
after the fact as ObGD's. For several networks' K agents at once.

Per network n (own eta) and agent k, t the step count, g the gradient of the network's output,
d the decay gamma lambda:

    v <- b2 v + (1 - b2) g^2;   D = sqrt(v / (1 - b2^t)) + 1e-8     (diagonal RMSProp scale)
    z <- d z + g
    sigma <- sigma + (1 - d) (g.D^-1 g - sigma);   sigma^ = max(sigma / (1 - d^t), 1)
    step = lr eta / max(sqrt(sigma^ z.D^-1 z), 1e-8)
    theta <- theta + step delta_n D^-1 z

delta_n is the TD error clipped at C = 20 running RMS (e <- bc e + (1 - bc) delta^2, from 1;
cap C sqrt(e / (1 - bc^t))); the actor's (`normalise`) is also divided by the running mean of
its magnitude. The intent: with d = 0 and a model linear in theta, sigma^ = g.D^-1 g at t = 1
and the output moves by exactly lr eta delta_n (NLMS); with traces, sigma^ is the running mean
of g.D^-1 g that the trace's norm is measured against. The traces, v, sigma and the two delta
statistics are the optimiser's state. sigma^'s floor of 1 is ours, not the paper's: a
saturated softmax policy's gradient (1e-35 in float32) took sigma^ to 1e-5 and the step to
1e6, and the weights to inf, within 3 k steps of MemoryChain; floored, an update moves theta
by at most eta |delta_n| in D's norm.
"""

from __future__ import annotations

import numpy as np
import torch

BETA2 = 0.999  # the RMSProp scale's decay
CLIP_MULT, BETA_CLIP = 20.0, 0.9998  # delta's clip: C running RMS, the RMS's decay
BETA_NORM = 0.9998  # the decay of the actor's running mean |delta|
EPS = 1e-8
SIGMA_FLOOR = 1.0  # ours: sigma^'s floor, a unit gradient's (the critic's output bias has one)


def intentional_step_size(sigma_hat, trace, scale, lr: float, eta: float):
    """The step size per agent (K,): lr eta / max(sqrt(sigma^ z.D^-1 z), 1e-8), for sigma^
    (K,), z and D `scale` (K, P). The reference form of `Intentional.step`'s."""
    norm = (trace.square() / scale).sum(1)
    return lr * eta / (sigma_hat * norm).sqrt().clamp(min=EPS)


class Intentional:
    """Intentional updates over `params` (N, K, P), updated in place; `etas` and `normalise`
    (divide delta by its running mean magnitude: the actor's) one per network."""

    def __init__(self, params, lr: float, etas: tuple[float, ...], decay: float, normalise):
        if not decay < 1.0:
            raise ValueError(f"intentional updates need gamma lambda < 1, got {decay}")
        self.params, self.decay = params, decay
        n, k = params.shape[:2]
        dt = params.dtype
        self.traces = torch.zeros_like(params)  # (N, K, P)
        self.rms = torch.zeros_like(params)  # v, the squared gradients' running mean
        self.sigma = torch.zeros(n, k, dtype=dt)
        self.clip_sq = torch.ones(k, dtype=dt)  # delta^2's running mean, from 1
        self.abs_mean = torch.zeros(k, dtype=dt)  # the clipped |delta|'s running mean
        self.t = 0
        self._lr_eta = torch.tensor([[lr * e] for e in etas], dtype=dt)  # (N, 1)
        self._normalise = torch.tensor(list(normalise), dtype=torch.bool).view(n, 1)
        self._scale = torch.empty_like(params)  # D
        self._scratch = torch.empty_like(params)

    def deltas(self, delta: torch.Tensor) -> torch.Tensor:
        """Each network's delta (N, K): clipped at C running RMS; the normalised networks'
        divided by the clipped magnitude's running mean (both statistics updated)."""
        t = self.t
        self.clip_sq.mul_(BETA_CLIP).addcmul_(delta, delta, value=1 - BETA_CLIP)
        cap = CLIP_MULT * (self.clip_sq / (1 - BETA_CLIP**t)).sqrt()
        clipped = torch.minimum(delta.abs(), cap).copysign(delta)
        self.abs_mean.mul_(BETA_NORM).add_(clipped.abs(), alpha=1 - BETA_NORM)
        mean = (self.abs_mean / (1 - BETA_NORM**t)).clamp(min=1e-12)
        return torch.where(self._normalise, clipped / mean, clipped)

    def step(self, grads: torch.Tensor, delta: torch.Tensor, frozen: bool = False):
        """v, z, sigma from grads (N, K, P); then theta += step delta_n D^-1 z (not when
        frozen); returns the step sizes (N, K). delta (K,)."""
        self.t += 1
        t, d = self.t, self.decay
        self.rms.mul_(BETA2).addcmul_(grads, grads, value=1 - BETA2)
        scale = torch.div(self.rms, 1 - BETA2**t, out=self._scale).sqrt_().add_(EPS)
        g_norm = torch.mul(grads, grads, out=self._scratch).div_(scale).sum(2)  # (N, K)
        z = self.traces
        torch.add(grads, z, alpha=d, out=z)
        z_norm = torch.mul(z, z, out=self._scratch).div_(scale).sum(2)
        self.sigma.add_(g_norm - self.sigma, alpha=1 - d)
        sigma_hat = (self.sigma / (1 - d**t)).clamp_(min=SIGMA_FLOOR)
        step = self._lr_eta / (sigma_hat * z_norm).sqrt_().clamp_(min=EPS)
        deltas = self.deltas(delta)
        if not frozen:
            direction = torch.div(z, scale, out=self._scratch)
            self.params.addcmul_((step * deltas).unsqueeze(2), direction)
        return step

    def reset_traces(self, rows: np.ndarray) -> None:
        """Zero the traces of the agents where rows (K,) bool (an episode's end)."""
        if rows.any():
            self.traces[:, torch.from_numpy(rows)] = 0.0

    # -- checkpoints (the traces are the agent's to save)

    def state_dict(self) -> dict:
        return {
            "rms": self.rms.clone(),
            "sigma": self.sigma.clone(),
            "clip_sq": self.clip_sq.clone(),
            "abs_mean": self.abs_mean.clone(),
            "t": self.t,
        }

    def load_state_dict(self, d: dict) -> None:
        for key in ("rms", "sigma", "clip_sq", "abs_mean"):
            getattr(self, key).copy_(d[key])
        self.t = int(d["t"])
