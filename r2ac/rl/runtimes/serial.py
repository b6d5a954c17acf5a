"""Serial runtime: actors and the learner alternate in one process; deterministic for a seed.

`batch_size / num_envs` actors (each with its own env batch, seeded from the one seed and
its index) collect one segment each with the current weights; the learner updates on their
concatenation. Checkpoints hold everything needed for a bit-identical resume: weights,
optimiser, scheduler, RNG states, env states (built-in envs), the actors' carried core
states, last observations / rewards / reset flags, and the counters.

Segments arrive as a list (`Actor.collect` in turn) and are joined along the streams; the
start states are not: the actors carry into their slices of two batch buffers in turn
(`StateSlots`), so a batch's start state is one buffer, taken whole. With a core that can
carry from its traces later (the eLSTM), one buffer: the actors defer their carries until
`publish_weights` (after the update) and run them in place (`Actor`, `defer_carry`), so a
batch's start state is overwritten then. Weights leave by sharing: on the CPU
the actors act with the learner's own modules, and with `--device cuda` with a CPU copy
that `publish_weights` refreshes after each update.
"""

from __future__ import annotations

import logging

from r2ac.rl.config import TrainConfig
from r2ac.rl.learning.actor import Actor, StateSlots, cat_segments
from r2ac.rl.model.build import actor_seed, agent_for_env, make_actor_env
from r2ac.rl.run.loop import set_rng_state
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.runtimes.base import Batch, Runtime, copy_weights
from r2ac.rtrl.state import state_from_plain
from r2ac.runs.values import ValueMismatch

log = logging.getLogger(__name__)


class SerialRuntime(Runtime):
    name = "serial"

    def __init__(self, cfg: TrainConfig, run: RunDir | None = None):
        super().__init__(cfg, run)
        seeds = [actor_seed(cfg.run.seed, i) for i in range(cfg.segments_per_batch)]
        envs = [make_actor_env(cfg, cfg.runtime.num_envs, s) for s in seeds]
        acting = agent_for_env(cfg, envs[0])
        # the actors carry into slices of batch buffers (no join of their states): of one,
        # in place after each update, where the core can carry from its traces later
        defer = acting.core.defers_carry
        self.slots = StateSlots(acting, cfg.runtime.num_envs, len(envs), count=1 if defer else 2)
        self.actors = [
            Actor(acting, env, s, cfg.runtime.unroll_length, carry_slots=slots, defer_carry=defer)
            for env, s, slots in zip(envs, seeds, self.slots.slots, strict=True)
        ]
        self.acting_agent = self.set_agent(acting)

    def next_batch(self) -> Batch:
        results = [actor.collect() for actor in self.actors]
        segments = [seg for seg, _ in results]
        joined = self.slots.joined([seg.state for seg in segments])
        return Batch(cat_segments(segments, joined), [ep for _, ep in results], policy_lag=0.0)

    def publish_weights(self) -> None:
        if self.acting_agent is not self.agent:
            copy_weights(self.acting_agent, self.agent)
        # the learner is done with the batch: the actors' deferred carries, in place over
        # its start state
        for actor in self.actors:
            actor.finish_carry()

    def runtime_state(self) -> dict:
        return {"actors": [a.get_state() for a in self.actors]}

    def check_runtime_state(self, payload: dict) -> None:
        """Besides the base's checks, each actor's core state has the fields of its own."""
        super().check_runtime_state(payload)
        for i, (saved, actor) in enumerate(zip(payload.get("actors", ()), self.actors)):
            try:
                state_from_plain(saved["state"], actor.state, f"actors[{i}].state")
            except ValueError as exc:
                raise ValueMismatch(str(exc)) from None

    def restore_runtime_state(self, payload: dict) -> None:
        set_rng_state(payload["rng"])
        exact = [a.set_state(s) for a, s in zip(self.actors, payload["actors"])]
        if not all(exact):
            log.warning("env %s has no get_state: resumed runs restart episodes", self.cfg.env.id)

    def close(self) -> None:
        for actor in self.actors:
            actor.env.close()
