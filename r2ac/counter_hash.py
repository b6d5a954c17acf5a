"""One counter-based hash (splitmix64's finaliser) for every random draw that must not depend
on the order of calls: the built-in envs' episodes and the streaming agents' actions.

Written twice over the same uint64 arithmetic: numpy (uint64 arrays) and torch (int64
tensors whose products wrap modulo 2**64, with logical right shifts), so that a draw is the
same bits whichever side makes it (tests/test_counter_hash.py). The torch form has no Python
branching: it runs inside a compiled step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a torch form runs: the numpy envs load without it
    import torch

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
_M64 = (1 << 64) - 1


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-mixing hash of uint64 arrays (array products
    wrap silently; only scalar ones would warn)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(MIX1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(MIX2)
    return x ^ (x >> np.uint64(31))


def _as_int64(value: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    value &= _M64
    return value - (1 << 64) if value >= 1 << 63 else value


def _srl(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic on int64)."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def mix64_torch(x: torch.Tensor) -> torch.Tensor:
    """`mix64` on int64 tensors holding uint64 bits."""
    x = (x ^ _srl(x, 30)) * _as_int64(MIX1)
    x = (x ^ _srl(x, 27)) * _as_int64(MIX2)
    return x ^ _srl(x, 31)


def _mix64_int(x: int) -> int:
    x = ((x ^ (x >> 30)) * MIX1) & _M64
    x = ((x ^ (x >> 27)) * MIX2) & _M64
    return x ^ (x >> 31)


def uniforms(seeds: np.ndarray, step: int, n: int) -> np.ndarray:
    """(K, n) float64 uniforms in (0, 1) from (seed, step, draw index), one row per seed. A
    few draws in Python integers (the same arithmetic, cheaper than numpy's per-call cost)."""
    if seeds.size * n <= 16:
        out = np.empty((seeds.size, n))
        for i, seed in enumerate(seeds.tolist()):
            key = _mix64_int((seed * GOLDEN + step * MIX1) & _M64)
            for j in range(n):
                out[i, j] = ((_mix64_int((key + (j + 1) * MIX2) & _M64) >> 11) + 0.5) * 2.0**-53
        return out
    with np.errstate(over="ignore"):
        key = mix64(seeds.astype(np.uint64) * np.uint64(GOLDEN) + np.uint64(step) * np.uint64(MIX1))
        idx = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(MIX2)
        bits = mix64(key[:, None] + idx[None, :]) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * 2.0**-53


def uniforms_torch(seeds: torch.Tensor, step: torch.Tensor, n: int) -> torch.Tensor:
    """`uniforms` in torch: seeds (K,) int64 (uint64 bits), step a 0-d int64 tensor; (K, n)
    float64, bit for bit the numpy draw."""
    import torch

    key = mix64_torch(seeds * _as_int64(GOLDEN) + step * _as_int64(MIX1))
    idx = torch.arange(1, n + 1, dtype=torch.int64, device=seeds.device) * _as_int64(MIX2)
    bits = _srl(mix64_torch(key.unsqueeze(1) + idx), 11)
    return (bits.to(torch.float64) + 0.5) * 2.0**-53


def hashed_ints(seeds, episodes, steps, purpose: int, high) -> np.ndarray:
    """Integers uniform in [0, high) (B,), one per stream, from (seed, episode, step, purpose).

    seeds, episodes, steps: (B,) integer arrays; high: int or (B,) array of positive ints."""
    key = mix64(seeds.astype(np.uint64) + episodes.astype(np.uint64) * np.uint64(GOLDEN))
    purpose_key = np.uint64((purpose * MIX2) & _M64)
    key = mix64(key + steps.astype(np.uint64) * np.uint64(MIX1) + purpose_key)
    return (key % np.asarray(high, dtype=np.uint64)).astype(np.int64)


def hashed_ints_torch(seeds, episodes, steps, purpose: int, high) -> torch.Tensor:
    """`hashed_ints` in torch: seeds, episodes, steps (B,) int64 tensors (uint64 bits), high
    a positive int below 2**31 or (B,) int64 tensor; (B,) int64, the numpy draw's values."""
    key = mix64_torch(seeds + episodes * _as_int64(GOLDEN))
    key = mix64_torch(key + steps * _as_int64(MIX1) + _as_int64(purpose * MIX2))
    return _umod(key, high)


def _umod(x: torch.Tensor, high) -> torch.Tensor:
    """x (uint64 bits in int64) modulo `high` (positive, < 2**31) as unsigned numbers: the
    high 32 bits and the low 32 apart, so no product leaves int64's range."""
    hi, lo = _srl(x, 32), x & 0xFFFFFFFF
    return ((hi % high) * ((1 << 32) % high) + lo % high) % high
