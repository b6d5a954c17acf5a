"""ObGD (Elsayed, Vasan & Mahmood 2024): SGD along eligibility traces with a step size bounded
so that one update cannot overshoot the TD target, for several networks at once.

Per network n (own kappa) and agent k, after z <- gamma lambda z + grad:

    M = alpha kappa max(|delta|, 1) ||z||_1;   theta <- theta + alpha / max(M, 1) delta z

The parameters, traces and gradients of N networks' K agents are (N, K, P) tensors (rows of one
network padded to P); every update is a few whole-tensor operations with no fresh (N, K, P)
tensor. The traces are the optimiser's state.
"""

from __future__ import annotations

import numpy as np
import torch


def obgd_step_size(delta: torch.Tensor, trace: torch.Tensor, lr: float, kappa: float):
    """ObGD's step size per agent (K,): alpha / max(alpha kappa max(|delta|, 1) ||z||_1, 1).

    delta (K,); trace (K, P). The reference form of `ObGD.step`'s bound."""
    delta_bar = delta.abs().clamp(min=1.0)
    bound = lr * kappa * delta_bar * trace.abs().sum(1)
    return lr / bound.clamp(min=1.0)


class ObGD:
    """ObGD over `params` (N, K, P), updated in place; `kappas` one per network."""

    def __init__(self, params: torch.Tensor, lr: float, kappas: tuple[float, ...], decay: float):
        self.params, self.lr, self.decay = params, lr, decay  # decay: gamma lambda
        self.traces = torch.zeros_like(params)  # (N, K, P)
        self._lr_kappa = torch.tensor([[lr * k] for k in kappas], dtype=params.dtype)  # (N, 1)
        self._scratch = torch.empty_like(params)  # |z| for the L1 norms

    def step(self, grads: torch.Tensor, delta: torch.Tensor, frozen: bool = False):
        """z <- decay z + grads, then theta += step delta z (not when frozen); returns the step
        sizes (N, K). delta (K,)."""
        z = self.traces
        torch.add(grads, z, alpha=self.decay, out=z)
        delta_bar = delta.abs().clamp_(min=1.0)
        l1 = torch.abs(z, out=self._scratch).sum(2)  # (N, K) (linalg.vector_norm: 4x slower)
        step = self.lr / (self._lr_kappa * delta_bar * l1).clamp_(min=1.0)
        if not frozen:
            self.params.addcmul_((step * delta).unsqueeze(2), z)
        return step

    def reset_traces(self, rows: np.ndarray) -> None:
        """Zero the traces of the agents where rows (K,) bool (an episode's end)."""
        if rows.any():
            self.traces[:, torch.from_numpy(rows)] = 0.0
