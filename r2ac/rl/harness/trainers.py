"""The trainer a config names, imported when chosen: the streaming agents' runtime for a
streaming algorithm, else the batched runtime `--runtime` names (config.RUNTIMES). A missing
optional package breaks only the trainer that needs it."""

from __future__ import annotations

import importlib

from r2ac.rl.config import RUNTIMES, TrainConfig, trainer_path
from r2ac.rl.run.loop import TrainingLoop
from r2ac.rl.run.run_dir import RunDir


def trainer_class(cfg: TrainConfig) -> type[TrainingLoop]:
    module, name = trainer_path(cfg)
    return getattr(importlib.import_module(module), name)


def make_trainer(cfg: TrainConfig, run: RunDir | None) -> TrainingLoop:
    return trainer_class(cfg)(cfg, run)


__all__ = ["RUNTIMES", "make_trainer", "trainer_class"]
