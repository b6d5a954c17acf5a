"""Parallel runtime: actor processes fill shared-memory segment slots; the learner batches them.

Process model (torch.multiprocessing, "spawn": children import torch afresh, so no OpenMP /
thread-pool state is inherited through fork; plumbing in r2ac/rl/runtimes/processes.py):

- Segment slots are preallocated once as shared-memory tensors (`share_memory_()`),
  including the core start state of their streams; actor k owns `slots_per_actor` of them.
- Actor process k owns one batched env (seeded from the one seed, k and its restart count)
  and an `Actor` (the same class as the serial runtime). For each segment it takes one of
  its free slots, copies the newest published weights if their version changed (a seqlock,
  `WeightBoard`), collects M steps, writes them into the slot and sends
  `SegmentReady(slot, actor, version, generation, seq, returns, lengths)` on its pipe.
- The learner (this process) waits on every actor's pipe and process sentinel at once, takes
  batch_size / num_envs ready segments, joins them along the batch dim (a copy), sends each
  slot back (`SlotFree`), updates, and publishes the weights as the next version.
  Policy lag = learner version at the update - version that produced the segment.

Faults: an actor that dies (its sentinel fires) has its ready segments dropped whole and is
started again, up to `max_actor_restarts` restarts in all, with streams from a zero core
state (`actor_restarts` in metrics.csv); past that, or when an actor raises (`ActorFailed`,
with its traceback), or when no segment arrives for `actor_timeout_s`, `next_batch` raises
ActorError naming it. The actors run in a process group of their own, ignore SIGINT and die
with the learner (PR_SET_PDEATHSIG); `close` sends Stop, joins with a timeout and kills
what is left.

Not deterministic (scheduling decides which actor's segment comes first). Checkpoints hold
weights, optimiser, scheduler, counters and the restart count; on resume the actors restart
their episodes from a zero core state (their env states are not saved).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import torch
import torch.multiprocessing as mp
from torch.utils import _pytree as pytree

from r2ac.rl.config import TrainConfig, learner_carries
from r2ac.rl.learning.actor import Actor, EpisodeLog, Segment, cat_segments
from r2ac.rl.model.build import actor_seed, agent_for_env, make_actor_env, make_env
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.runtimes.base import ActorError, Batch, Runtime
from r2ac.rl.runtimes.learner_carry import LearnerCarry
from r2ac.rl.runtimes.processes import (
    ActorFailed,
    ActorSpec,
    SegmentReady,
    SlotFree,
    Stop,
    WeightBoard,
    describe_exit,
    die_with_parent,
    ignore_interrupts,
    spawn_into_group,
)
from r2ac.runs.stop import signals_deferred

log = logging.getLogger(__name__)
POLL_S = 0.1  # how often a waiting process looks up from its pipe
CLOSE_TIMEOUT_S = 10.0  # close(): time the actors get to exit before they are killed
STOPPING_NOW_S = 0.5  # the same after a signal in set-up (they hold nothing to keep)


def _copy_into(dst, src) -> None:
    for d, s in zip(pytree.tree_leaves(dst), pytree.tree_leaves(src)):
        if d is not None:  # None leaves (e.g. no sensitivities) stay None
            d.copy_(s)


def _clone(tree):
    return pytree.tree_map(lambda t: None if t is None else t.clone(), tree)


def actor_main(spec: ActorSpec, cfg: TrainConfig, conn: Connection, slots, board) -> None:
    """Body of an actor process (module level so that spawn can import it): act until Stop,
    or until the learner is gone; an exception goes to the learner with its traceback."""
    die_with_parent(spec.parent_pid)
    ignore_interrupts()
    code = 0
    try:
        _act(spec, cfg, conn, slots, board)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the learner closed its end: nobody to report to
    except Exception:  # noqa: BLE001 - reported to the learner, which raises ActorError
        code = 1
        try:
            conn.send(ActorFailed(spec.index, traceback.format_exc()))
        except OSError:
            pass
    # Nothing of ours needs the interpreter's teardown, which takes seconds with torch
    # loaded (the learner's shutdown waits for it).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _act(spec: ActorSpec, cfg: TrainConfig, conn: Connection, slots, board: WeightBoard) -> None:
    torch.set_num_threads(1)
    seed = actor_seed(cfg.run.seed, spec.index, spec.generation)
    torch.manual_seed(seed)
    env = make_actor_env(cfg, cfg.runtime.num_envs, seed)
    try:
        agent = agent_for_env(cfg, env, load_stem=False)
        light = learner_carries(cfg)  # the learner carries the sensitivities
        actor = Actor(agent, env, seed, cfg.runtime.unroll_length, sensitivities=not light)
        free, version, seq = list(spec.slots), -1, 0
        while _await_slot(conn, free, spec.parent_pid):
            slot = free.pop(0)
            version = board.read_into(agent, version)
            seg, episodes = actor.collect()
            _copy_into(slots[spec.slots.index(slot)], seg)
            seq += 1
            ready = SegmentReady(
                slot,
                spec.index,
                version,
                spec.generation,
                seq,
                tuple(episodes.returns),
                tuple(episodes.lengths),
            )
            conn.send(ready)
    finally:
        env.close()


def _await_slot(conn: Connection, free: list[int], parent_pid: int) -> bool:
    """Read the learner's messages until one of our slots is free; False on Stop or when
    the learner is gone."""
    while not free or conn.poll():
        if not conn.poll(POLL_S):
            if os.getppid() != parent_pid:
                return False
            continue
        message = conn.recv()
        if isinstance(message, Stop):
            return False
        free.append(message.slot)
    return True


@dataclass
class _Handle:
    """The learner's side of one actor process."""

    spec: ActorSpec
    process: mp.Process
    conn: Connection


class ParallelRuntime(Runtime):
    name = "parallel"
    actor_target = staticmethod(actor_main)  # tests swap in a faulty actor

    def __init__(self, cfg: TrainConfig, run: RunDir | None = None):
        super().__init__(cfg, run)
        env = make_env(cfg, cfg.runtime.num_envs, actor_seed(cfg.run.seed, 0))
        agent = self.set_agent(agent_for_env(cfg, env))
        light = learner_carries(cfg)
        example = Actor(agent, env, 0, cfg.runtime.unroll_length, sensitivities=not light)
        template = Segment(**example.segment_buffers(), state=example.state)
        env.close()
        self.slots_per_actor = max(2, math.ceil(2 * cfg.segments_per_batch / cfg.actors))
        self.slots = [
            pytree.tree_map(
                lambda t: None if t is None else torch.zeros_like(t).share_memory_(), template
            )
            for _ in range(cfg.actors * self.slots_per_actor)
        ]
        self.board = WeightBoard.create(self.agent_state_cpu())
        self.carry = LearnerCarry(self.agent) if light else None
        self.handles: dict[int, _Handle] = {}
        self.ready: list[SegmentReady] = []
        self.restarts, self.pgid = 0, 0

    @property
    def processes(self) -> list:
        """The actor processes now running (or not yet joined)."""
        return [h.process for h in self.handles.values()]

    def runtime_state(self) -> dict:
        return {"actor_restarts": self.restarts}

    def restore_runtime_state(self, payload: dict) -> None:
        self.restarts = int(payload.get("actor_restarts", 0))
        log.warning("parallel runtime: resumed actors restart their episodes")

    def extra_metrics(self) -> dict[str, float]:
        return {"actor_restarts": float(self.restarts)}

    def start(self) -> None:
        self.publish_weights()
        for k in range(self.cfg.actors):
            self._spawn(k, generation=0)

    def _spawn(self, index: int, generation: int) -> None:
        """Start actor process `index` on its own slots (in the actors' process group)."""
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        first = index * self.slots_per_actor
        spec = ActorSpec(
            index, generation, tuple(range(first, first + self.slots_per_actor)), os.getpid()
        )
        process = ctx.Process(
            target=self.actor_target,
            name=f"r2ac-actor-{index}",
            daemon=True,
            args=(spec, self.cfg, theirs, [self.slots[s] for s in spec.slots], self.board),
        )
        # whole or not at all: a child cut off while it reads its start-up data prints a
        # traceback (EOFError), and one started but not in `handles` is never stopped
        with signals_deferred():
            with spawn_into_group(self.pgid) as group:
                process.start()
            self.pgid = group.pgid
            theirs.close()
            self.handles[index] = _Handle(spec, process, ours)

    def publish_weights(self) -> None:
        self.board.publish(self.agent.state_dict(), self.version)

    def next_batch(self) -> Batch:
        need = self.cfg.segments_per_batch
        deadline = time.monotonic() + self.cfg.runtime.actor_timeout_s
        while len(self.ready) < need:
            if self._receive(timeout=min(POLL_S * 10, self.cfg.runtime.actor_timeout_s)):
                deadline = time.monotonic() + self.cfg.runtime.actor_timeout_s
            elif time.monotonic() > deadline:
                raise ActorError(
                    f"no segment from any actor in {self.cfg.runtime.actor_timeout_s:g} s "
                    f"(actor_timeout_s); actors: {self._describe()}"
                )
        items = self._take(need)
        segs = [self.slots[m.slot] for m in items]
        if self.carry is not None:  # in arrival order: each actor's segments come in order
            segs = [
                self.carry.complete(m.actor, m.generation, m.seq, s) for m, s in zip(items, segs)
            ]
        batch = cat_segments(segs) if len(segs) > 1 else _clone(segs[0])
        for m in items:
            self._send(m.actor, SlotFree(m.slot))
        lag = sum(self.version - m.version for m in items) / len(items)
        return Batch(batch, [EpisodeLog(list(m.returns), list(m.lengths)) for m in items], lag)

    def _take(self, need: int) -> list[SegmentReady]:
        """The `need` oldest ready segments (each actor's in the order it sent them)."""
        items, self.ready = self.ready[:need], self.ready[need:]
        return items

    def _receive(self, timeout: float) -> bool:
        """Wait up to `timeout` on every pipe and process sentinel; take what arrived and
        handle deaths. Returns whether a segment arrived."""
        by_conn = {h.conn: h for h in self.handles.values()}
        by_sentinel = {h.process.sentinel: h for h in self.handles.values()}
        ready = wait([*by_conn, *by_sentinel], timeout)
        before = len(self.ready)
        dead = [by_sentinel[r] for r in ready if r in by_sentinel]
        for h in [by_conn[r] for r in ready if r in by_conn]:
            if not self._drain(h) and h not in dead:
                dead.append(h)
        for h in dead:
            self._restart(h)
        return len(self.ready) > before

    def _drain(self, h: _Handle) -> bool:
        """Every message waiting on `h`'s pipe; False if the pipe is closed (it died)."""
        try:
            while h.conn.poll():
                message = h.conn.recv()
                if isinstance(message, ActorFailed):
                    last = message.traceback.strip().splitlines()[-1]
                    raise ActorError(
                        f"actor {message.actor} (pid {h.process.pid}) raised {last}",
                        traceback=message.traceback,
                    )
                self.ready.append(message)
        except (EOFError, OSError):
            return False
        return True

    def _send(self, index: int, message) -> None:
        """Send to actor `index`; a dead one is found by its sentinel at the next wait."""
        h = self.handles.get(index)
        if h is not None:
            try:
                h.conn.send(message)
            except OSError:
                pass

    def _restart(self, h: _Handle) -> None:
        """Drop a dead actor's segments whole; start it again, or raise ActorError."""
        h.process.join(timeout=CLOSE_TIMEOUT_S)
        if h.process.is_alive():
            h.process.kill()
            h.process.join(timeout=CLOSE_TIMEOUT_S)
        h.conn.close()
        del self.handles[h.spec.index]
        self.ready = [m for m in self.ready if m.actor != h.spec.index]
        what = (
            f"actor {h.spec.index} (pid {h.process.pid}) died ({describe_exit(h.process.exitcode)})"
        )
        if self.restarts >= self.cfg.runtime.max_actor_restarts:
            raise ActorError(
                f"{what}; no restart left (max_actor_restarts={self.cfg.runtime.max_actor_restarts})"
            )
        self.restarts += 1
        log.warning(
            "%s; restarting it (%d of %d)", what, self.restarts, self.cfg.runtime.max_actor_restarts
        )
        self._spawn(h.spec.index, h.spec.generation + 1)

    def _describe(self) -> str:
        return ", ".join(
            f"{k} (pid {h.process.pid}, {describe_exit(h.process.exitcode)})"
            for k, h in sorted(self.handles.items())
        )

    def close(self) -> None:
        """Tell every actor to stop, join them within CLOSE_TIMEOUT_S, kill the rest; after
        a signal in set-up (`stopping_now`: actors importing torch read no message yet) within
        STOPPING_NOW_S."""
        for index in list(self.handles):
            self._send(index, Stop())
        deadline = time.monotonic() + (STOPPING_NOW_S if self.stopping_now else CLOSE_TIMEOUT_S)
        for h in self.handles.values():
            h.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for h in self.handles.values():
            if h.process.is_alive():
                if not self.stopping_now:
                    log.warning(
                        "actor %d did not stop in %g s: killed", h.spec.index, CLOSE_TIMEOUT_S
                    )
                h.process.kill()
                h.process.join(timeout=CLOSE_TIMEOUT_S)
            h.conn.close()
        self.handles = {}
        self.ready = []
