"""The copy task's two training schedules (docs/tasks/copy.md): Adam steps with global
gradient-norm clipping, either once per sequence or after every step with an output.

- per sequence (`sequence_update`): the batch is run in chunks of `segment` steps with the
  state carried; every chunk that has outputs calls its own `loss.backward()` and .grad
  accumulates; one optimiser step at the end. Rule "rtrl" gives the exact gradient through
  the whole sequence whatever the chunk length; rule "bptt" truncates it at chunk starts
  (truncated BPTT; a chunk as long as the sequence is full BPTT).
- fully online (`online_update`, rule "rtrl" only): one step at a time, an optimiser step
  after every step that has an output, so the weights change during the sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from r2ac.errors import ConfigError
from r2ac.tasks.copy.config import CopyConfig
from r2ac.tasks.copy.data import CopyBatch
from r2ac.tasks.copy.metrics import count_correct, masked_ce_sum
from r2ac.tasks.copy.model import CopyModel


class UpdateStats(NamedTuple):
    loss: float  # mean cross-entropy per output bit of the batch
    bit_accuracy: float  # on the training batch (before/while updating)
    updates: int  # optimiser steps taken


def _clip_and_step(model: nn.Module, optimizer: torch.optim.Optimizer, clip: float) -> None:
    if clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()


def sequence_update(
    model: CopyModel,
    optimizer: torch.optim.Optimizer,
    batch: CopyBatch,
    segment: int | None = None,
    clip: float = 1.0,
) -> UpdateStats:
    """One optimiser step on the batch's whole-sequence loss, processed in chunks of `segment`.

    Loss = cross-entropy summed over output bits / number of output bits in the batch. Each
    chunk with outputs backpropagates its share; chunks without outputs (the reading phase)
    run without autograd (rule "rtrl" still carries its sensitivities through them).
    """
    T, B = batch.mask.shape
    segment = T if segment is None else segment
    n_out = int(batch.mask.sum())
    optimizer.zero_grad(set_to_none=True)
    state = model.initial_state(B)
    total, correct = 0.0, 0
    for t0 in range(0, T, segment):
        x, target, mask = (v[t0 : t0 + segment] for v in batch[:3])
        if not bool(mask.any()):
            with torch.no_grad():
                _, state = model(x, state)
            continue
        logits, state = model(x, state)
        loss = masked_ce_sum(logits, target, mask) / n_out
        loss.backward()
        total += float(loss.detach())
        correct += count_correct(logits.detach(), target, mask)
    _clip_and_step(model, optimizer, clip)
    return UpdateStats(total, correct / n_out, 1)


def online_update(
    model: CopyModel, optimizer: torch.optim.Optimizer, batch: CopyBatch, clip: float = 1.0
) -> UpdateStats:
    """Fully online RTRL: one step at a time, an optimiser step after every step with outputs.

    The loss of step t is the cross-entropy summed over the streams that write at t, divided
    by the batch size, so the step losses of a sequence add up to the per-sequence loss (sum
    over bits / B). The carried sensitivities were accumulated under earlier weights: RTRL's
    usual online approximation (docs/rules/rtrl.md, "Staleness").
    """
    if model.core.rule != "rtrl":
        raise ConfigError("online learning needs rule 'rtrl' (BPTT cannot update mid-sequence)")
    T, B = batch.mask.shape
    n_out = int(batch.mask.sum())
    state = model.initial_state(B)
    total, correct, updates = 0.0, 0, 0
    for t in range(T):
        x, target, mask = (v[t : t + 1] for v in batch[:3])
        if not bool(mask.any()):
            with torch.no_grad():
                _, state = model(x, state)
            continue
        optimizer.zero_grad(set_to_none=True)
        logits, state = model(x, state)
        loss_sum = masked_ce_sum(logits, target, mask)
        (loss_sum / B).backward()
        _clip_and_step(model, optimizer, clip)
        total += float(loss_sum.detach())
        correct += count_correct(logits.detach(), target, mask)
        updates += 1
    return UpdateStats(total / n_out, correct / n_out, updates)


def update(cfg: CopyConfig, model: CopyModel, optimizer, batch: CopyBatch) -> UpdateStats:
    """One training batch under the schedule of `cfg` (online or per sequence)."""
    if cfg.online:
        return online_update(model, optimizer, batch, cfg.clip)
    return sequence_update(model, optimizer, batch, cfg.segment, cfg.clip)
