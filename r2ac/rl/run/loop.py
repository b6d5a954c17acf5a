"""The training loop every trainer shares: the batched runtimes (r2ac/rl/runtimes/) and the
streaming agents' (r2ac/rl/stream/runtime.py).

A trainer supplies one `step(tracker)` (one update and its record) and its checkpoint; the loop
owns the rest::

    with a stop guard (SIGINT / SIGTERM: finish the step, checkpoint, TrainingInterrupted;
                       until the first step is done: stop at once, KeyboardInterrupt):
        tracker = make_tracker()
        start()
        until tracker.done:
            step(tracker)
            checkpoint() every checkpoint_every updates, at the end, on a stop request
        close()                                   always, also on errors and signals

What every trainer answers besides (the commands use nothing else): `restore(payload)`,
`checkpoint(tracker)`, `evaluate(sets, episodes, greedy)` (the dict eval.json holds) and the
class method `memory_estimate(cfg, sizes)` (bytes by part, for the check before a run starts).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from r2ac.rl.config import TrainConfig
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.run.tracker import Tracker
from r2ac.runs.plain import from_numpy, to_numpy
from r2ac.runs.stop import StopRequest, TrainingInterrupted


class TrainingDiverged(RuntimeError):  # noqa: N818  (a stop of the run, like ActorError)
    """An update left the agent's weights (or its loss) non-finite: nothing of it is published
    or checkpointed; the last checkpoint holds the weights before it."""


def rng_state() -> dict:
    """The global generators' states as plain data: numpy's key array as a tensor."""
    return {
        "torch": torch.get_rng_state(),
        "numpy": from_numpy(np.random.get_state()),  # noqa: NPY002
        "python": random.getstate(),
    }


def set_rng_state(saved: dict) -> None:
    torch.set_rng_state(saved["torch"])
    np.random.set_state(to_numpy(saved["numpy"]))  # noqa: NPY002
    random.setstate(saved["python"])


class TrainingLoop:
    """The loop and its stop, checkpoint and close discipline; see the module docstring."""

    name = "base"

    def __init__(self, cfg: TrainConfig, run: RunDir | None = None):
        self.cfg, self.run = cfg, run
        self.saved_counters: dict | None = None
        self.stopping_now = False  # close() after a signal in set-up: nothing to wait for

    # -- the trainer's part

    def make_tracker(self) -> Tracker:
        return Tracker(self.cfg, self.run, self.saved_counters)

    def start(self) -> None:
        pass

    def step(self, tracker: Tracker) -> None:
        raise NotImplementedError

    def checkpoint(self, tracker: Tracker) -> None:
        raise NotImplementedError

    def restore(self, payload: dict, source=None) -> None:
        raise NotImplementedError

    def evaluate(self, sets: int, episodes: int, greedy: bool) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        pass

    # -- owned by the loop

    def train(self) -> Tracker:
        """Train to the end; on SIGINT/SIGTERM finish the step, checkpoint and raise
        TrainingInterrupted."""
        with StopRequest() as stop:
            tracker = self.make_tracker()
            try:
                # until the first update of this process is done nothing is there to save
                # beyond the last checkpoint: a signal stops at once (actors starting, their
                # first segments, a compiled step's first call), not after step 1's checkpoint
                stop.stop_at_once()
                self.start()
                while not tracker.done:
                    self.step(tracker)
                    stop.at_once = False
                    self._after_step(tracker, stop)
            except KeyboardInterrupt:  # stopped at once: actors still starting are not waited for
                self.stopping_now = True
                raise
            finally:
                stop.at_once = False  # closing (Ray's shutdown takes seconds) is not cut short
                try:
                    self.close()
                finally:
                    tracker.close()
        if stop.requested:  # a signal while closing (Ray's shutdown takes seconds): answer it
            raise TrainingInterrupted(stop.signum, tracker.update, self.run is not None)
        return tracker

    def _after_step(self, tracker: Tracker, stop: StopRequest) -> None:
        """A checkpoint when due, at the end or when stopping; then the stop itself."""
        if tracker.update % self.cfg.run.checkpoint_every == 0 or tracker.done or stop.requested:
            self.checkpoint(tracker)
        if stop.requested:
            raise TrainingInterrupted(stop.signum, tracker.update, self.run is not None)
