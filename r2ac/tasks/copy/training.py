"""The copy task's training loop: batches from a seeded stream, one schedule step each, an
evaluation on the fixed test set every `eval_every` batches, a checkpoint after each, and a
clean stop on SIGINT / SIGTERM (the batch finishes, a checkpoint is written,
`TrainingInterrupted` is raised; `--resume` continues bit-identically)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from r2ac.runs.stop import StopRequest, TrainingInterrupted
from r2ac.tasks.copy import resume
from r2ac.tasks.copy.config import DTYPES, CopyConfig
from r2ac.tasks.copy.data import batch_to, make_batch, make_test_set
from r2ac.tasks.copy.metrics import evaluate
from r2ac.tasks.copy.model import CopyModel, build_model
from r2ac.tasks.copy.schedules import UpdateStats, update


class CopyDiverged(RuntimeError):  # noqa: N818  (a stop of the run)
    """A batch left the loss or the weights non-finite: nothing of it is saved."""


@dataclass
class RunResult:
    curve: list[dict[str, float]]
    final: dict[str, float]
    steps: int
    updates: int
    train_seconds: float
    solved_at_step: int | None


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


class Trainer:
    """One run's state: model, optimiser, test set, the training data's generator and its
    Progress (from `checkpoint` when `cfg.resume` and the file exists)."""

    def __init__(self, cfg: CopyConfig, checkpoint: str | None = None):
        self.cfg, self.checkpoint = cfg, checkpoint
        self.model = build_model(cfg)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.test_set = make_test_set(cfg.length, cfg.test_size, cfg.test_seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.progress = resume.Progress()
        if cfg.resume and checkpoint and os.path.exists(checkpoint):
            self.progress = resume.load(
                checkpoint, cfg, self.model, self.optimizer, self.gen, cfg.device
            )

    @property
    def done(self) -> bool:
        p, cfg = self.progress, self.cfg
        return p.step >= cfg.train_steps or (p.solved is not None and cfg.stop_when_solved)

    @property
    def eval_due(self) -> bool:
        step = self.progress.step
        return step % self.cfg.eval_every == 0 or step == self.cfg.train_steps

    def train_batch(self) -> UpdateStats:
        """Draw the next batch and take one schedule step on it (timed)."""
        cfg, p = self.cfg, self.progress
        batch = make_batch(cfg.batch_size, cfg.length, self.gen)
        batch = batch_to(batch, cfg.device, DTYPES[cfg.dtype])
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.learning_rate(p.step)
        t0 = time.perf_counter()
        stats = update(cfg, self.model, self.optimizer, batch)
        p.seconds += time.perf_counter() - t0
        self._check_finite(stats, p.step + 1)
        p.step += 1
        p.updates += stats.updates
        p.window.append(stats)
        return stats

    def _check_finite(self, stats: UpdateStats, step: int) -> None:
        """CopyDiverged if batch `step` left a non-finite loss or weights (before a checkpoint
        or the curve sees them)."""
        norms = torch.stack([p.detach().float().norm() for p in self.model.parameters()])
        if math.isfinite(stats.loss) and bool(torch.isfinite(norms).all()):
            return
        raise CopyDiverged(
            f"training diverged at batch {step}: loss {stats.loss:g}, weights "
            f"{'finite' if bool(torch.isfinite(norms).all()) else 'no longer finite'} (is "
            f"--lr {self.cfg.lr:g} too large?); the last checkpoint holds the weights before it"
        )

    def record(self) -> dict[str, float]:
        """Evaluate on the test set, append a curve row; the full evaluation."""
        p = self.progress
        ev = evaluate(self.model, self.test_set, self.cfg.device)
        p.curve.append(
            {
                "step": p.step,
                "updates": p.updates,
                "seconds": round(p.seconds, 3),
                "train_loss": _mean(s.loss for s in p.window),
                "train_bit_accuracy": _mean(s.bit_accuracy for s in p.window),
                "test_loss": ev["loss"],
                "test_bit_accuracy": ev["bit_accuracy"],
                "test_sequence_accuracy": ev["sequence_accuracy"],
            }
        )
        p.window.clear()
        if ev["sequence_accuracy"] == 1.0 and p.solved is None and p.step > 0:
            p.solved = p.step
        return ev

    def save(self) -> None:
        if self.checkpoint:
            resume.save(
                self.checkpoint, self.cfg, self.model, self.optimizer, self.gen, self.progress
            )

    def result(self, final: dict[str, float]) -> RunResult:
        p = self.progress
        return RunResult(p.curve, final, p.step, p.updates, p.seconds, p.solved)


def train(
    cfg: CopyConfig,
    on_batch: Callable[[int, UpdateStats], None] | None = None,
    on_eval: Callable[[list[dict[str, float]]], None] | None = None,
    checkpoint: str | None = None,
    on_start: Callable[[], None] | None = None,
) -> tuple[CopyModel, RunResult]:
    """Train per `cfg`, evaluating on the fixed test set every `eval_every` batches.

    `on_eval` gets the curve after each evaluation (the new row last), once its checkpoint is
    written. `seconds` in the curve counts training time only. With `checkpoint` (a path) the
    run is saved there at every evaluation and on SIGINT / SIGTERM (then TrainingInterrupted
    is raised), and with `cfg.resume` it continues from it when the file exists. `on_start`
    is called once the checkpoint has been read back (a bad one raised ConfigError before).
    """
    cfg.validate()
    run = Trainer(cfg, checkpoint)
    if on_start:
        on_start()
    final: dict[str, float] = {}
    with StopRequest() as stop:
        if not run.progress.curve:
            final = run.record()
            if on_eval:
                on_eval(run.progress.curve)
        while not run.done and not stop.requested:
            stats = run.train_batch()
            if on_batch:
                on_batch(run.progress.step, stats)
            if run.eval_due:
                final = run.record()
                run.save()
                if on_eval:
                    on_eval(run.progress.curve)
            elif stop.requested:
                run.save()
        if stop.requested:
            saved = checkpoint is not None and os.path.exists(checkpoint)
            raise TrainingInterrupted(stop.signum, run.progress.step, saved)
    if not final:  # resumed a run that had already reached its budget
        final = evaluate(run.model, run.test_set, cfg.device)
    return run.model, run.result(final)
