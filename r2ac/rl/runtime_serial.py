"""Serial runtime: actors and the learner alternate in one process; deterministic for a seed.

`batch_size / num_envs` actors (each with its own env batch, seeded from the one seed and
its index) collect one segment each with the current weights; the learner updates on their
concatenation. Checkpoints hold everything needed for a bit-identical resume: weights,
optimiser, scheduler, RNG states, env states (built-in envs), the actors' carried core
states, last observations / rewards / reset flags, and the counters.
"""

from __future__ import annotations

import logging
import random

import numpy as np
import torch

from r2ac.errors import ConfigError
from r2ac.rl.actor import Actor, cat_segments
from r2ac.rl.build import actor_seed, agent_for_env, make_env, seed_everything
from r2ac.rl.config import TrainConfig, to_dict
from r2ac.rl.learner import Learner
from r2ac.rl.run_dir import RunDir
from r2ac.rl.stop import StopRequest, TrainingInterrupted
from r2ac.rl.tracker import Tracker

log = logging.getLogger(__name__)


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "python": random.getstate(),
    }


def set_rng_state(saved: dict) -> None:
    torch.set_rng_state(saved["torch"])
    np.random.set_state(saved["numpy"])  # noqa: NPY002
    random.setstate(saved["python"])


def load_agent_weights(agent: torch.nn.Module, state_dict: dict, source) -> None:
    try:
        agent.load_state_dict(state_dict)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise ConfigError(
            f"{source}: checkpoint does not match the config: {' '.join(first[:3])[:400]}"
        ) from exc


class SerialRuntime:
    def __init__(self, cfg: TrainConfig, run: RunDir | None = None):
        self.cfg, self.run = cfg, run
        seed_everything(cfg.seed)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        seeds = [actor_seed(cfg.seed, i) for i in range(cfg.segments_per_batch)]
        envs = [make_env(cfg, cfg.num_envs, s) for s in seeds]
        self.agent = agent_for_env(cfg, envs[0])
        self.actors = [Actor(self.agent, env, s, cfg.unroll_length) for env, s in zip(envs, seeds)]
        self.learner = Learner(self.agent, cfg)
        self.saved_counters = None

    def restore(self, payload: dict) -> None:
        load_agent_weights(
            self.agent, payload["agent"], self.run.path if self.run else "checkpoint"
        )
        self.learner.load_state_dict(payload["learner"])
        set_rng_state(payload["rng"])
        exact = [a.set_state(s) for a, s in zip(self.actors, payload["actors"])]
        if not all(exact):
            log.warning("env %s has no get_state: resumed runs restart episodes", self.cfg.env)
        self.saved_counters = payload["counters"]

    def checkpoint(self, tracker: Tracker) -> None:
        if self.run is None:
            return
        tracker.flush()  # the rows up to this update are on disk before the checkpoint is
        self.run.save_checkpoint(
            {
                "agent": self.agent.state_dict(),
                "learner": self.learner.state_dict(),
                "rng": rng_state(),
                "actors": [a.get_state() for a in self.actors],
                "counters": tracker.state(),
                "config": to_dict(self.cfg),
                "runtime": "serial",
            }
        )

    def train(self) -> Tracker:
        """Train to the end; on SIGINT/SIGTERM finish the update, checkpoint and raise
        TrainingInterrupted (a resume then continues from that update, bit-identically)."""
        cfg = self.cfg
        tracker = Tracker(cfg, self.run, self.saved_counters)
        frames = cfg.unroll_length * cfg.batch_size
        try:
            with StopRequest() as stop:
                while not tracker.done:
                    results = [actor.collect() for actor in self.actors]
                    metrics = self.learner.update(cat_segments([seg for seg, _ in results]))
                    tracker.record(frames, [ep for _, ep in results], metrics, policy_lag=0.0)
                    if tracker.update % cfg.checkpoint_every == 0 or tracker.done or stop.requested:
                        self.checkpoint(tracker)
                    if stop.requested:
                        raise TrainingInterrupted(stop.signum, tracker.update, self.run is not None)
        finally:
            tracker.close()
        return tracker
