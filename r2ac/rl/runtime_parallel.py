"""Parallel runtime: actor processes fill shared-memory segment slots; the learner batches them.

Process model (torch.multiprocessing, "spawn" start method: children import torch afresh,
so no OpenMP / thread-pool state is inherited through fork):

- `num_slots` segments are preallocated once as shared-memory tensors (`share_memory_()`),
  including the core start state of their streams. Slot indices circulate through two
  queues: `free` (the learner hands slots back) and `full` (an actor filled one).
- Actor process k owns one batched env (seeded from the one seed and k) and an `Actor`
  (the same class as the serial runtime). Before each segment it copies the newest
  published weights if their version changed, collects M steps, writes them into a free
  slot and puts (slot, actor, weight version, finished episodes) on `full`.
- The learner (this process) takes batch_size / num_envs full slots, concatenates them
  along the batch dim (a copy), frees the slots, runs `Learner.update` and publishes the
  weights into a shared-memory state_dict under a lock, incrementing the version.
  Policy lag = learner version at the update - version that produced the segment.

Not deterministic (scheduling decides which actor's segment comes first). Checkpoints hold
weights, optimiser, scheduler and counters; on resume the actors restart their episodes
from a zero core state (their env states are not saved).
"""

from __future__ import annotations

import logging
import queue
import signal
import traceback

import torch
import torch.multiprocessing as mp
from torch.utils import _pytree as pytree

from r2ac.rl.actor import Actor, Segment, cat_segments
from r2ac.rl.build import actor_seed, agent_for_env, make_env
from r2ac.rl.config import TrainConfig
from r2ac.rl.run_dir import RunDir
from r2ac.rl.runtime import ActorError, Batch, Runtime

log = logging.getLogger(__name__)
POLL_S = 0.1


def _copy_into(dst, src) -> None:
    for d, s in zip(pytree.tree_leaves(dst), pytree.tree_leaves(src)):
        if d is not None:  # None leaves (e.g. no sensitivities) stay None
            d.copy_(s)


def _clone(tree):
    return pytree.tree_map(lambda t: None if t is None else t.clone(), tree)


def actor_process(index, cfg, slots, free_q, full_q, weights, version, lock, stop) -> None:
    """Body of actor process `index` (module level so that spawn can import it)."""
    # Ctrl-C (and `timeout`'s SIGTERM) reach the whole process group: the learner decides
    # when to stop, finishes its update, and stops us through `stop` (or SIGKILL).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        torch.set_num_threads(1)
        seed = actor_seed(cfg.seed, index)
        torch.manual_seed(seed)
        env = make_env(cfg, cfg.num_envs, seed)
        agent = agent_for_env(cfg, env, load_stem=False)
        actor, used = Actor(agent, env, seed, cfg.unroll_length), -1
        while not stop.is_set():
            try:
                slot = free_q.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if version.value != used:
                with lock:
                    agent.load_state_dict(weights)
                    used = version.value
            seg, episodes = actor.collect()
            _copy_into(slots[slot], seg)
            full_q.put((slot, index, used, episodes.returns, episodes.lengths))
        env.close()
    except Exception:  # noqa: BLE001 - reported to the learner, which raises
        full_q.put(("error", index, traceback.format_exc()))


class ParallelRuntime(Runtime):
    name = "parallel"

    def __init__(self, cfg: TrainConfig, run: RunDir | None = None):
        super().__init__(cfg, run)
        env = make_env(cfg, cfg.num_envs, actor_seed(cfg.seed, 0))
        agent = self.set_agent(agent_for_env(cfg, env))
        example = Actor(agent, env, 0, cfg.unroll_length)
        template = Segment(**example._buffers(), state=example.state)
        env.close()
        self.num_slots = max(2 * cfg.actors, 2 * cfg.segments_per_batch)
        self.slots = [
            pytree.tree_map(
                lambda t: None if t is None else torch.zeros_like(t).share_memory_(), template
            )
            for _ in range(self.num_slots)
        ]
        self.weights = {k: v.clone().share_memory_() for k, v in self.agent_state_cpu().items()}
        self.processes = []

    def restore_runtime_state(self, payload: dict) -> None:
        log.warning("parallel runtime: resumed actors restart their episodes")

    def start(self) -> None:
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.free_q, self.full_q = ctx.Queue(), ctx.Queue()
        self.lock, self.stop = ctx.Lock(), ctx.Event()
        self.shared_version = ctx.Value("q", 0)
        self.publish_weights()
        for slot in range(self.num_slots):
            self.free_q.put(slot)
        for k in range(self.cfg.actors):
            p = ctx.Process(
                target=actor_process,
                daemon=True,
                name=f"r2ac-actor-{k}",
                args=(
                    k,
                    self.cfg,
                    self.slots,
                    self.free_q,
                    self.full_q,
                    self.weights,
                    self.shared_version,
                    self.lock,
                    self.stop,
                ),
            )
            p.start()
            self.processes.append(p)

    def publish_weights(self) -> None:
        if not hasattr(self, "lock"):
            return
        with self.lock:
            for k, v in self.agent.state_dict().items():
                self.weights[k].copy_(v)
            self.shared_version.value = self.version

    def _next_full(self):
        while True:
            try:
                item = self.full_q.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead:
                    raise ActorError(f"actor processes died: {dead}") from None
                continue
            if item[0] == "error":
                raise ActorError(f"actor {item[1]} failed:\n{item[2]}")
            return item

    def next_batch(self) -> Batch:
        items = [self._next_full() for _ in range(self.cfg.segments_per_batch)]
        segs = [self.slots[slot] for slot, *_ in items]
        batch = cat_segments(segs) if len(segs) > 1 else _clone(segs[0])
        for slot, *_ in items:
            self.free_q.put(slot)
        lag = sum(self.version - v for _, _, v, *_ in items) / len(items)
        return Batch(batch, [_episodes(r, n) for *_, r, n in items], lag)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the actors, drain the queue so none blocks on a put, and join them."""
        if not self.processes:
            return
        self.stop.set()
        for p in self.processes:
            p.join(timeout=timeout)
            while p.is_alive():
                self._drain()
                p.join(timeout=POLL_S)
                timeout -= POLL_S
                if timeout < 0:
                    p.kill()  # actors ignore SIGTERM (see actor_process)
                    p.join()
        self._drain()
        self.processes = []

    def _drain(self) -> None:
        try:
            while True:
                self.full_q.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass


def _episodes(returns, lengths):
    from r2ac.rl.actor import EpisodeLog

    return EpisodeLog(list(returns), list(lengths))
