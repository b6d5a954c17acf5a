"""The copy task's sequences: a seeded generator of padded, masked batches and the test set.

A sequence with pattern length k (uniform in min_len..max_len) has 2k steps: k random bits,
then k blanks '#'; while reading the j-th blank (step k + j) the model must write bit j.
Batches mix lengths, so they are padded to the longest sequence; padded steps have an
all-zero input and no target.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

SYMBOLS = ("0", "1", "#")  # input vocabulary, one-hot; padding is the all-zero vector
INPUT_SIZE = len(SYMBOLS)
BLANK = 2


class CopyBatch(NamedTuple):
    """A padded batch of copy sequences (time-major, like the cores' contract)."""

    x: Tensor  # (T, B, 3) one-hot input, zeros at padded steps
    target: Tensor  # (T, B) int64 bit to write (0 where mask is False)
    mask: Tensor  # (T, B) bool, True at the output-phase steps (k <= t < 2k)
    pattern_len: Tensor  # (B,) int64, k; the sequence has 2k real steps


def make_batch(
    batch_size: int, max_len: int, generator: torch.Generator, min_len: int = 1
) -> CopyBatch:
    """Draw `batch_size` sequences with pattern lengths uniform in min_len..max_len (on CPU).

    Deterministic given the generator's state; T = 2 * (longest pattern in the batch).
    """
    if batch_size < 1 or not 1 <= min_len <= max_len:
        raise ValueError(
            f"make_batch: need batch_size >= 1 and 1 <= min_len <= max_len, "
            f"got {batch_size}, {min_len}, {max_len}"
        )
    k = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)  # (B,)
    k_max = int(k.max())
    bits = torch.randint(0, 2, (k_max, batch_size), generator=generator)  # (K, B)
    t = torch.arange(2 * k_max)[:, None]  # (T, 1)
    reading = t < k  # (T, B)
    mask = (t >= k) & (t < 2 * k)
    read_idx = t.clamp(max=k_max - 1).expand(-1, batch_size)  # (T, B)
    symbol = torch.where(reading, bits.gather(0, read_idx), BLANK)
    x = nn.functional.one_hot(symbol, INPUT_SIZE).float()
    x = x * (t < 2 * k).unsqueeze(-1)  # zero the padding
    src = (t - k).clamp(0, k_max - 1)  # (T, B) index of the bit to write at step t
    target = bits.gather(0, src) * mask
    return CopyBatch(x, target, mask, k)


def make_test_set(max_len: int, size: int, seed: int, batch_size: int = 500) -> list[CopyBatch]:
    """A fixed held-out set of `size` sequences (lengths uniform in 1..max_len), in batches."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [min(batch_size, size - i) for i in range(0, size, batch_size)]
    return [make_batch(n, max_len, gen) for n in sizes]


def batch_to(
    batch: CopyBatch, device: torch.device | str, dtype: torch.dtype | None = None
) -> CopyBatch:
    """The batch on `device`, its one-hot input in `dtype` (the model's; None: unchanged)."""
    return CopyBatch(batch.x.to(device, dtype), *(v.to(device) for v in batch[1:]))
