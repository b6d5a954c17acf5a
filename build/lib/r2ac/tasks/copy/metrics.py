"""The copy task's loss and its honest metric: every output bit counts, 0s and 1s alike.

The reference implementation maps the target '1' to the index its loss and metric ignore,
so an untrained model scores 100% there; here `bit_accuracy` of a model that has learnt
nothing is about 0.5 (docs/tasks/copy.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from r2ac.tasks.copy.data import CopyBatch, batch_to
from r2ac.tasks.copy.model import dtype_of


def masked_ce_sum(logits: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Sum of the cross-entropy over the masked steps: logits (T, B, 2), target/mask (T, B)."""
    ce = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
    return (ce * mask.flatten()).sum()


def count_correct(logits: Tensor, target: Tensor, mask: Tensor) -> int:
    """Output bits (mask True) whose argmax is the target: logits (T, B, 2), target/mask (T, B)."""
    return int(((logits.argmax(-1) == target) & mask).sum())


def _test_logits(model: nn.Module, batch: CopyBatch) -> Tensor:
    """The model's logits (T, B, 2) over a test batch, from a fresh state."""
    state = model.initial_state(batch.mask.shape[1], with_sensitivities=False)
    logits, _ = model(batch.x, state)
    return logits


@torch.no_grad()
def evaluate(model: nn.Module, test_set: Iterable[CopyBatch], device="cpu") -> dict[str, float]:
    """Accuracy over every output bit of the test set (0s and 1s alike), and per sequence.

    Returns bit_accuracy, sequence_accuracy, bit_accuracy_zeros / _ones (the two target
    values separately), sequence_accuracy_longest (patterns longer than 3/4 of the longest
    in the set), loss (cross-entropy per output bit), n_sequences and n_bits.
    """
    bits = right = seqs = seqs_right = 0
    by_value = {0: [0, 0], 1: [0, 0]}
    long_right = long_n = 0
    loss = 0.0
    batches = [batch_to(b, device, dtype_of(model)) for b in test_set]
    k_max = max(int(b.pattern_len.max()) for b in batches)
    for batch in batches:
        logits = _test_logits(model, batch)
        ok = (logits.argmax(-1) == batch.target) | ~batch.mask  # (T, B)
        loss += float(masked_ce_sum(logits, batch.target, batch.mask))
        bits += int(batch.mask.sum())
        right += int((ok & batch.mask).sum())
        for v in (0, 1):
            sel = batch.mask & (batch.target == v)
            by_value[v][0] += int(sel.sum())
            by_value[v][1] += int((ok & sel).sum())
        seq_ok = ok.all(0)  # (B,)
        seqs += len(seq_ok)
        seqs_right += int(seq_ok.sum())
        longest = batch.pattern_len * 4 > 3 * k_max
        long_n += int(longest.sum())
        long_right += int((seq_ok & longest).sum())
    return {
        "bit_accuracy": right / bits,
        "sequence_accuracy": seqs_right / seqs,
        "bit_accuracy_zeros": by_value[0][1] / max(by_value[0][0], 1),
        "bit_accuracy_ones": by_value[1][1] / max(by_value[1][0], 1),
        "sequence_accuracy_longest": long_right / max(long_n, 1),
        "loss": loss / bits,
        "n_sequences": seqs,
        "n_bits": bits,
    }


@torch.no_grad()
def sequence_accuracy_by_length(
    model: nn.Module, test_set: Iterable[CopyBatch], device="cpu"
) -> dict[int, float]:
    """Fraction of test sequences with every output bit right, per pattern length k."""
    right: dict[int, list[int]] = {}
    for batch in (batch_to(b, device, dtype_of(model)) for b in test_set):
        logits = _test_logits(model, batch)
        seq_ok = ((logits.argmax(-1) == batch.target) | ~batch.mask).all(0)  # (B,)
        for k, ok in zip(batch.pattern_len.tolist(), seq_ok.tolist()):
            right.setdefault(k, []).append(ok)
    return {k: sum(v) / len(v) for k, v in sorted(right.items())}


def longest_all_right(by_length: dict[int, float]) -> int:
    """The largest k such that every test sequence of every length up to k is right (0: none)."""
    return max(
        (k for k in by_length if all(v == 1.0 for j, v in by_length.items() if j <= k)), default=0
    )
