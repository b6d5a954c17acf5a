"""The eLSTM carry's inputs as scans without Python loops, written for the compiler.

Shared by the fused GPU candidates (gpu_carry.py's torch.compile path and gpu_triton.py), so
neither imports the other. Same values as math.py's `carry_factors` / `_carry_inputs`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def suffix_products(a: Tensor) -> Tensor:
    """g(tau) = prod_{s > tau} a(s), (T, B, N): elstm_math.carry_factors as one scan (no
    Python loop over T, no division, so exact with the zeros of a reset)."""
    rest = torch.cumprod(a[1:].flip(0), 0).flip(0)  # (T-1, B, N): g(0) .. g(T-2)
    return torch.cat([rest, torch.ones_like(a[:1])])


def carry_inputs(fh: Tensor, zh: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """u = g(tau) * [fh; zh](tau) (T, B, 2, N) and G = prod_s a(s) (B, N) of a segment."""
    g = suffix_products(a)  # (T, B, N)
    return torch.stack([g * fh, g * zh], 2), g[0] * a[0]


def wb_increment(u: Tensor, cp: Tensor) -> Tensor:
    """sum_tau u(tau) * [cp, cp, 1, 1](tau), (B, 4, N): the segment's part of wb."""
    return torch.cat([(u * cp[:, :, None, :]).sum(0), u.sum(0)], 1)
