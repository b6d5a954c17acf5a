"""Ray runtime: Ray actors (here or on a cluster) collect segments; the learner batches them.

A `Runtime` (r2ac/rl/runtimes/base.py owns the loop, checkpoints, logging and the clean stop);
segments arrive through Ray's object store and weights leave by `ray.put`. Process model
(Ray Core; docs/rl.md, "Runtimes" and "On a cluster"):

- `num_actors` Ray actors (`num_cpus=1` each), each a `RayActor`: its own env batch, seeded
  from the one seed and its index, a CPU copy of the agent and an `Actor` (the class the
  serial runtime uses).
- Weights leave the learner once per version as the state_dict's numpy arrays
  (`PublishedWeights`): inside the segment requests when small (<= INLINE_WEIGHTS_BYTES,
  sent with the call), else `ray.put` once and pulled by an actor (`ray.get`, zero-copy on
  its node) at the start of a segment whose version differs from the one it holds.
  Segments are requested with the newest published version.
- Each actor has `IN_FLIGHT` requests queued (one running, one waiting), so it never waits
  for the learner. Its `SegmentReady` (the segment and its start core state, packed as
  numpy by r2ac.rl.runtimes.wire) travels through the object store. With `sensitivity_carry`
  learner (the default here) the start state is light and the learner completes it with
  the sensitivities it carries for that actor's streams (r2ac/rl/runtimes/learner_carry.py); with
  `actor` it holds the actor's RTRL sensitivities (97% of a segment's bytes). The
  learner takes the oldest ready ones, batch_size / num_envs per update, concatenates them
  (the one copy), and requests the next segment from each actor it took one from.
  Policy lag = learner version at the update - version that produced the segment.
- Faults: Ray restarts an actor whose process died (`max_restarts`); its new process starts
  its streams from a zero core state (and, once the learner has seen the restart, from
  seeds of their own). The segments it was collecting are lost whole (nothing of a segment
  leaves an actor before it is complete). The learner sees a restart as a new `instance` in
  an actor's segments and counts it in metrics.csv (`actor_restarts`); more than
  `max_actor_restarts` in all stop the run with an ActorError, and so does an exception
  inside an actor (with the actor's traceback). An actor seen dead (a failed request, or
  Ray's actor table) is missing until a segment of its new process comes: `actors_missing`
  in metrics.csv, and one line at the end of a run that ended without it.
- A local Ray dies with the learner, even a SIGKILLed one: its processes carry a token that
  a reaper process (ray_reaper.py) looks for when the learner is gone.

Not deterministic (which actor's segment comes first is up to the scheduler). Checkpoints
hold weights, optimiser, scheduler, counters and the restart count; on resume the actors
restart their episodes from a zero core state. `close()` kills every actor and disconnects:
a Ray started here (no `--ray-address`) is shut down with it; a cluster joined here keeps
running, without this run's actors.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from torch.utils import _pytree as pytree

from r2ac.environ import environ
from r2ac.envs import trust
from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig, learner_carries
from r2ac.rl.learning.actor import Actor, EpisodeLog, cat_segments
from r2ac.rl.model.build import actor_seed, agent_for_env, make_actor_env, make_env
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.runtimes import wire
from r2ac.rl.runtimes.base import ActorError, Batch, Runtime
from r2ac.rl.runtimes.learner_carry import LearnerCarry
from r2ac.rl.runtimes.ray_reaper import TOKEN_VAR, Reaper

LOCAL_RAY_STARTED = False  # whether this process started a local Ray (init_local_ray)

log = logging.getLogger(__name__)

RAY_OPTIONS = {"include_dashboard": False, "logging_level": logging.WARNING}
IN_FLIGHT = 2  # segment requests queued per actor: one being collected, one waiting
# Weights up to this size travel inside the requests: Ray sends task arguments up to 100 KiB
# (its max_direct_call_object_size) with the call itself, while a `ray.put` into the
# object store cost the learner ~19% of its time at 87 kB a version (py-spy, built-in
# task); larger weights (image stems) are put once a version.
INLINE_WEIGHTS_BYTES = 90 * 1024
WAIT_S = 0.2  # a wait for segments wakes up this often (to check actor_timeout_s)
START_S = 300.0  # actors not all constructed after this long: stop with an error
KILL_S = 30.0  # killed actors of a Ray left running must stop answering within this long
STOCK_S = 1.0  # Ray's view of the actors (dead, restarting) is read this often, and at the end


# --- messages (frozen: what crosses a process boundary is never modified) --------------------


@dataclass(frozen=True)
class PublishedWeights:
    """A weights version: small ones travel inside each request, larger ones sit in the
    object store (`ray.put` once a version). The reference sits in a tuple so that Ray does
    not fetch it with the request: an actor fetches it only when its version is new."""

    version: int
    refs: tuple[Any, ...] = ()  # (ObjectRef of the state_dict as numpy arrays,) or ()
    arrays: dict[str, np.ndarray] | None = None  # the state_dict itself, when small

    def state_dict(self) -> dict[str, torch.Tensor]:
        arrays = self.arrays if self.arrays is not None else ray.get(self.refs[0])
        return state_dict_from_numpy(arrays)


@dataclass(frozen=True)
class SegmentRequest:
    """Learner -> actor: collect one segment with these weights. `epoch` counts the deaths
    of this actor the learner has seen; a higher one than the actor's restarts its streams
    (with a seed of their own, so that a restarted actor does not replay its episodes)."""

    weights: PublishedWeights
    epoch: int


@dataclass(frozen=True)
class SegmentReady:
    """Actor -> learner, through the object store: one whole segment."""

    actor: int
    instance: int  # random per actor process: a new one means Ray restarted the actor
    epoch: int
    seq: int  # segments collected by this actor since its streams (re)started: 1, 2, ...
    version: int  # the weights version that acted
    segment: Any  # a Segment packed by r2ac.rl.runtimes.wire (numpy arrays, start state included)
    returns: tuple[float, ...]
    lengths: tuple[int, ...]

    def episodes(self) -> EpisodeLog:
        return EpisodeLog(list(self.returns), list(self.lengths))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CARETS = re.compile(r"^\s*\^+\s*$")


def exception_line(trace: str) -> str:
    """'Type: message' of a traceback, on one line (the lines after its last frame)."""
    lines = trace.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    after = lines[frames[-1] + 1 :] if frames else lines[-1:]
    start = next((i for i, line in enumerate(after) if line and not line[0].isspace()), 0)
    return " ".join(line.strip() for line in after[start:] if line.strip())


def remote_traceback(exc: Exception) -> str:
    """What Ray says of an exception inside an actor (the actor's process, its frames, the
    exception), without terminal colours and Python's ^^^ markers."""
    lines = _ANSI.sub("", str(exc)).rstrip().splitlines()
    return "\n".join(line for line in lines if not _CARETS.match(line))


# --- the actor ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActorPlace:
    """Where an actor runs: its Ray node, its process and that process's niceness."""

    node: str
    pid: int
    niceness: int


def streams_seed(seed: int, index: int, epoch: int) -> int:
    """Seed of actor `index`'s streams after `epoch` deaths (epoch 0: the serial runtime's)."""
    if epoch == 0:
        return actor_seed(seed, index)
    return int(np.random.SeedSequence([seed, index, epoch]).generate_state(1)[0] % 2**31)


def state_dict_from_numpy(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: wire.unpack_tensor(wire.PackedTensor(v, None)) for k, v in arrays.items()}


class RayActor:
    """Body of one Ray actor: an env batch, a CPU agent copy and an `Actor` (made remote by
    `RayRuntime`; a plain class, so that it can be tested without Ray)."""

    def __init__(self, cfg: TrainConfig, index: int, dtype: torch.dtype = torch.float32):
        torch.set_num_threads(1)
        self.cfg, self.index, self.dtype = cfg, index, dtype
        self.instance = secrets.randbits(62)
        self.version, self.epoch = -1, -1
        self._restart_streams(0)

    def _restart_streams(self, epoch: int) -> None:
        """A fresh env batch and zero core states (after a restart: new seeds)."""
        cfg, seed = self.cfg, streams_seed(self.cfg.run.seed, self.index, epoch)
        torch.manual_seed(seed)
        if self.epoch >= 0:
            self.env.close()
        self.env = make_actor_env(cfg, cfg.runtime.num_envs, seed)
        if self.epoch < 0:
            self.agent = agent_for_env(cfg, self.env, self.dtype, load_stem=False)
        light = learner_carries(cfg)  # the learner carries the sensitivities
        self.actor = Actor(
            self.agent, self.env, seed, cfg.runtime.unroll_length, sensitivities=not light
        )
        self.epoch, self.seq = epoch, 0

    def where(self) -> ActorPlace:
        return ActorPlace(ray.get_runtime_context().get_node_id(), os.getpid(), os.nice(0))

    def collect(self, request: SegmentRequest) -> SegmentReady:
        if request.epoch > self.epoch:
            self._restart_streams(request.epoch)
        weights = request.weights
        if weights.version != self.version:
            self.agent.load_state_dict(weights.state_dict())
            self.version = weights.version
        seg, episodes = self.actor.collect()
        self.seq += 1
        return SegmentReady(
            actor=self.index,
            instance=self.instance,
            epoch=self.epoch,
            seq=self.seq,
            version=self.version,
            segment=wire.pack(seg),
            returns=tuple(episodes.returns),
            lengths=tuple(episodes.lengths),
        )


# --- connecting to Ray -------------------------------------------------------------------------


def actor_runtime_env() -> dict:
    """What the actors' processes get from this one, whichever node runs them: this process's
    env-module trust (r2ac/envs/trust.py), which Ray does not carry to a cluster's other nodes
    (their workers start with their raylet's environment). Always set, empty when nothing is
    trusted: a node's own setting neither adds nor removes a module."""
    return {"env_vars": {trust.TRUST_VAR: os.environ.get(trust.TRUST_VAR, "")}}


def connect(cfg: TrainConfig) -> tuple[bool, Reaper | None]:
    """Start a local Ray (no address) or join a cluster. Returns whether this call connected
    this process (so close() disconnects it, which stops a Ray it started) and, for a local
    Ray, the reaper that kills what is left of it when this process ends (ray_reaper.py)."""
    if ray.is_initialized():  # e.g. tests sharing one Ray instance: not ours to shut down
        return False, None
    with sigterm_stays_ours():
        if cfg.runtime.ray_address is None:
            t0 = time.perf_counter()
            reaper = init_local_ray(cfg.actors)
            seconds = time.perf_counter() - t0
            log.info("ray: local Ray with %d CPUs started in %.1f s", cfg.actors, seconds)
            return True, reaper
        check_reachable(cfg.runtime.ray_address)
        try:
            ray.init(address=cfg.runtime.ray_address, **RAY_OPTIONS)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"--ray-address {cfg.runtime.ray_address}: cannot join Ray: {first}"
            ) from exc
    return True, None


def init_local_ray(num_cpus: int) -> Reaper | None:
    """Start a local Ray whose processes carry a reaper's token (they die with this
    process: ray_reaper.py) and whose workers run at this process's niceness. Ray's raylet
    starts workers at nice 15 by default (its `worker_niceness`), which suits helper tasks
    but not actors that do most of a run's work: beside anything at nice 0 (the learner,
    another job) they get a few percent of a core (measured: `import torch` 47 s instead of
    1 s, an actor at 1.3 k instead of 18 k frames/s on a box with two other jobs). A value
    the user set in RAY_worker_niceness is kept. A Ray half started when a signal or an
    error ends `ray.init` is left to the reaper, which this process's exit wakes."""
    global LOCAL_RAY_STARTED
    LOCAL_RAY_STARTED = True  # r2ac.cli ends such a process with os._exit (see there)
    reaper = Reaper.start()
    values = {"RAY_worker_niceness": os.environ.get("RAY_worker_niceness", str(os.nice(0)))}
    if reaper is not None:
        values[TOKEN_VAR] = reaper.token
    with environ(**values):
        try:
            ray.init(address="local", num_cpus=num_cpus, **RAY_OPTIONS)
        except BaseException:
            if reaper is not None:
                reaper.close()
            raise
    return reaper


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """ConfigError unless something listens at HOST:PORT (`ray.init` would retry for
    minutes); `auto` is left to Ray, which fails at once when it finds no cluster."""
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); "
            "start the head with `ray start --head`"
        ) from None


@contextmanager
def sigterm_stays_ours() -> Iterator[None]:
    """`ray.init` installs SIGTERM handlers (`sys.exit(15)` while it starts, then its node's:
    stop Ray, `sys.exit(1)`), so a SIGTERM during start-up ended r2ac with status 15 and no
    line. Inside, Ray's way of installing them does nothing, so the process's
    own handler (the CLI's: Terminated, one line, exit 143) stays; and whatever handler is
    there at the end is replaced by the one found at the start. The driver's core worker
    gets no C++ failure-signal handler either (`keep_ray_failure_handler_out`)."""
    keep_ray_failure_handler_out()
    previous = signal.getsignal(signal.SIGTERM)
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    install = getattr(utils, "set_sigterm_handler", None)
    if install is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if install is not None:
            utils.set_sigterm_handler = install
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def keep_ray_failure_handler_out() -> None:
    """No C++ failure-signal handler (Abseil's, installed by Ray's core worker) in this
    process. It takes SIGTERM too: while `ray.shutdown()` uninstalls it (about 1.3 s at a
    run's end) a SIGTERM printed "*** SIGTERM received" and killed the process (status -15,
    no line), and the uninstall left SIGTERM at the default action behind Python's back.
    Without it SIGTERM stays Python's from `ray.init` to exit. Set on Ray's
    constant, not in the environment, so the actors' processes keep theirs (their C++
    crashes are still reported); the driver's Python stack is what a crash here shows."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and hasattr(constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"):
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


def check_cpus(needed: int) -> None:
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < needed:
        raise ConfigError(
            f"the Ray cluster has {cpus:g} CPUs, {needed} actors need one each "
            "(--num-actors, or add nodes with `ray start --address`)"
        )


@dataclass(frozen=True)
class _Request:
    """A segment request in flight."""

    actor: int


# --- the runtime -------------------------------------------------------------------------------


class RayRuntime(Runtime):
    """Segments arrive from Ray actors through the object store; weights leave by `ray.put`."""

    name = "ray"

    def __init__(
        self, cfg: TrainConfig, run: RunDir | None = None, dtype: torch.dtype = torch.float32
    ):
        super().__init__(cfg, run)
        self.dtype = dtype  # float64 only for the exactness tests
        env = make_env(cfg, cfg.runtime.num_envs, actor_seed(cfg.run.seed, 0))
        self.set_agent(agent_for_env(cfg, env, dtype))
        env.close()
        self.carry = LearnerCarry(self.agent) if learner_carries(cfg) else None
        self.restarts, self.weights = 0, None
        self.actors: list[Any] = []
        self.pending: dict[Any, _Request] = {}  # ObjectRef -> request, oldest first
        self.deaths = [0] * cfg.actors  # restarts seen per actor: the epoch of its streams
        self.instances: list[int | None] = [None] * cfg.actors
        self.missing: dict[int, int] = {}  # actor -> version when its death was seen
        self.stock_taken = time.monotonic()
        self.connected, self.reaper = connect(cfg)
        try:
            check_cpus(cfg.actors)
            self._make_actors()
        except BaseException:
            self.close()
            raise

    def _make_actors(self) -> None:
        remote = ray.remote(
            num_cpus=1,
            max_restarts=self.cfg.runtime.max_actor_restarts,
            max_task_retries=0,
            runtime_env=actor_runtime_env(),
        )(RayActor)
        self.actors = [remote.remote(self.cfg, k, self.dtype) for k in range(self.cfg.actors)]
        t0 = time.perf_counter()
        try:
            places = ray.get([a.where.remote() for a in self.actors], timeout=START_S)
        except ray.exceptions.GetTimeoutError:
            raise ActorError(
                f"{len(self.actors)} Ray actors not running after {START_S:.0f} s "
                "(`ray status` shows what the cluster is short of)"
            ) from None
        except ray.exceptions.RayActorError as exc:  # an exception in RayActor.__init__
            trace = remote_traceback(exc)
            raise ActorError(f"an actor failed to start: {exception_line(trace)}", trace) from None
        log.info(
            "ray: %d actors on %d node(s), up in %.1f s",
            len(self.actors),
            len({p.node for p in places}),
            time.perf_counter() - t0,
        )
        mine = os.nice(0)
        nicer = sorted({p.niceness for p in places if p.niceness > mine})
        if nicer:
            log.warning(
                "ray: actors run at niceness %s, the learner at %d: anything else on their "
                "nodes takes their CPU first (start the nodes with RAY_worker_niceness=%d, "
                "e.g. `RAY_worker_niceness=0 ray start ...`)",
                ", ".join(map(str, nicer)),
                mine,
                mine,
            )

    # -- weights out, segments in

    def publish_weights(self) -> None:
        arrays = {k: v.numpy() for k, v in self.agent_state_cpu().items()}
        if sum(a.nbytes for a in arrays.values()) <= INLINE_WEIGHTS_BYTES:
            # a copy: requests are pickled when sent, and the arrays may be the parameters
            snapshot = {k: a.copy() for k, a in arrays.items()}
            self.weights = PublishedWeights(self.version, arrays=snapshot)
        else:
            self.weights = PublishedWeights(self.version, refs=(ray.put(arrays),))

    def start(self) -> None:
        self.publish_weights()
        for _ in range(IN_FLIGHT):
            for k in range(len(self.actors)):
                self._request(k)

    def _request(self, k: int) -> None:
        ref = self.actors[k].collect.remote(SegmentRequest(self.weights, self.deaths[k]))
        self.pending[ref] = _Request(k)

    def next_batch(self) -> Batch:
        got = self._gather()
        lag = sum(self.version - m.version for m in got) / len(got)
        try:
            segs = [wire.unpack(m.segment, f"actor {m.actor}'s segment") for m in got]
        except wire.WireError as exc:  # not what RayActor.collect sends: refused
            raise ActorError(f"refusing what an actor sent: {exc}") from None
        if self.carry is not None:  # in arrival order: each actor's segments come in order
            segs = [self.carry.complete(m.actor, m.epoch, m.seq, s) for m, s in zip(got, segs)]
        if len(segs) > 1:
            segment = cat_segments(segs)  # the learner's own, writable copy
        elif self.device.type == "cpu":  # the object store's arrays are read-only, and the
            segment = _clone(segs[0])  # learner's RTRL carry writes the start state
        else:
            segment = segs[0]  # the move to the device copies it
        if self.version == 0:
            self._log_sizes(got[0])
        return Batch(segment, [m.episodes() for m in got], lag)

    def _log_sizes(self, first: SegmentReady) -> None:
        total = wire.nbytes(first.segment)
        state = wire.nbytes(wire.field(first.segment, "state"))
        log.info(
            "ray: %.0f kB a segment through the object store, %.0f kB of it the start state",
            total / 1e3,
            state / 1e3,
        )

    def _gather(self) -> list[SegmentReady]:
        """batch_size / num_envs segments, oldest requests first."""
        got: list[SegmentReady] = []
        last = time.monotonic()
        while len(got) < self.cfg.segments_per_batch:
            for ref in self._ready(self.cfg.segments_per_batch - len(got)):
                seg = self._receive(ref)
                if seg is not None:
                    got.append(seg)
                    last = time.monotonic()
            if time.monotonic() - last > self.cfg.runtime.actor_timeout_s:
                raise ActorError(
                    f"no segment from any of the {len(self.actors)} Ray actors in "
                    f"{self.cfg.runtime.actor_timeout_s:g} s (actor_timeout_s)"
                )
        return got

    def _ready(self, need: int) -> list:
        """Up to `need` ready references, oldest requests first (none after WAIT_S)."""
        pending = list(self.pending)
        ready, _ = ray.wait(pending, num_returns=1, timeout=WAIT_S)
        if not ready:
            return []
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        ready = set(ready)
        return [ref for ref in pending if ref in ready][:need]

    def _receive(self, ref) -> SegmentReady | None:
        """The segment behind a ready reference, or None if its actor died collecting it."""
        k = self.pending.pop(ref).actor
        try:
            ready = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            trace = remote_traceback(exc)
            raise ActorError(f"actor {k} raised {exception_line(trace)}", trace) from None
        except ray.exceptions.ActorDiedError as exc:  # Ray will not restart it
            raise ActorError(
                f"actor {k} died and Ray will not restart it (--max-actor-restarts "
                f"{self.cfg.runtime.max_actor_restarts}): {type(exc).__name__}"
            ) from None
        except ray.exceptions.RayActorError as exc:  # dead: Ray restarts it
            log.warning("ray: actor %d lost a segment (%s)", k, type(exc).__name__)
            self.missing.setdefault(k, self.version)
            ready = None
        except ray.exceptions.ObjectLostError as exc:
            log.warning("ray: actor %d lost a segment (%s)", k, type(exc).__name__)
            ready = None
        if ready is not None and ready.instance != self.instances[k]:
            self._restarted(k, ready.instance)
        self._request(k)
        return ready

    def _restarted(self, k: int, instance: int) -> None:
        """A new process behind actor k: after the first, a restart (its streams began anew)."""
        self.missing.pop(k, None)
        if self.instances[k] is not None:
            self.deaths[k] += 1
            self.restarts += 1
            log.warning("ray: actor %d was restarted (%d restarts in all)", k, self.restarts)
            if self.restarts > self.cfg.runtime.max_actor_restarts:
                raise ActorError(
                    f"actor {k} died; {self.restarts} restarts in all, more than "
                    f"--max-actor-restarts {self.cfg.runtime.max_actor_restarts}"
                )
        self.instances[k] = instance

    # -- checkpoints, metrics, the end

    def runtime_state(self) -> dict:
        return {"actor_restarts": self.restarts}

    def restore_runtime_state(self, payload: dict) -> None:
        self.restarts = payload.get("actor_restarts", 0)
        log.warning("ray runtime: resumed actors restart their episodes")

    def extra_metrics(self) -> dict[str, float]:
        if time.monotonic() - self.stock_taken >= STOCK_S:
            self._take_stock()
        return {"actor_restarts": self.restarts, "actors_missing": len(self.missing)}

    def end_of_run(self) -> None:
        self._take_stock()  # the last row says which actors the run ended without

    def _take_stock(self) -> None:
        """Actors Ray is restarting (or gave up on) are missing from now on, until a segment
        of a new process comes: a death with no request in flight (the requests already
        answered, the next ones queued by Ray for the new process) fails no request."""
        self.stock_taken = time.monotonic()
        for k, state in enumerate(actor_states(self.actors)):
            if state is not None and state != "ALIVE":
                self.missing.setdefault(k, self.version)

    def report_missing(self) -> None:
        """One line at the end of a run for the actors that died and were not back."""
        self._take_stock()
        if self.missing:
            log.warning(missing_line(self.missing, self.version, len(self.actors)))

    def actor_places(self) -> list[ActorPlace]:
        """Where every actor runs now (a restarted actor has a new process)."""
        return ray.get([a.where.remote() for a in self.actors], timeout=START_S)

    def close(self) -> None:
        """Say which actors were missing at the end; stop every actor; disconnect from Ray,
        which stops a Ray this runtime started."""
        if self.actors:
            self.report_missing()
        for a in self.actors:
            ray.kill(a, no_restart=True)
        if not self.connected:  # a Ray we leave running: return once its actors are gone
            _wait_until_dead(self.actors, KILL_S)
        self.actors, self.pending, self.weights = [], {}, None
        if self.connected and ray.is_initialized():
            ray.shutdown()
        if self.reaper is not None:  # it kills what Ray left of itself (ray_reaper.py)
            self.reaper.close()
        self.connected, self.reaper = False, None


def actor_states(actors: list) -> list[str | None]:
    """Ray's state of each actor ('ALIVE', 'RESTARTING', 'DEAD', ...; 0.4 ms an actor), None
    where unknown. Ray's public state API (ray.util.state) needs the dashboard, which r2ac
    does not start; this reads the GCS's actor table through ray._private.state, and gives
    None if that fails (then only deaths that failed a request in flight are seen)."""
    try:
        from ray._private import state

        return [state.actors(actor_id=a._actor_id.hex()).get("State") for a in actors]
    except Exception:  # noqa: BLE001  (a private API: any change of it means "unknown")
        return [None] * len(actors)


def missing_line(missing: dict[int, int], version: int, actors: int) -> str:
    """'ray: actor 1 died 3 updates before the end ...' (one line)."""
    which = sorted(missing)
    names = ", ".join(str(k) for k in which)
    ago = ", ".join(str(version - missing[k]) for k in which)
    one = len(which) == 1
    return (
        f"ray: actor{'' if one else 's'} {names} died {ago} update{'' if ago == '1' else 's'} "
        f"before the end of the run and {'its restart' if one else 'their restarts'} had not "
        f"come: the run ended with {actors - len(which)} of {actors} actors "
        "(actors_missing in metrics.csv)"
    )


def _wait_until_dead(actors: list, timeout_s: float) -> None:
    """`ray.kill` only starts a kill: a call right after it can still be answered (seen in
    1 of 4 test runs). Poll each actor until its calls fail, or warn after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for a in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(a.where.remote(), timeout=max(deadline - time.monotonic(), 0.01))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
            time.sleep(0.05)
        else:
            log.warning("ray: an actor was still answering %.0f s after ray.kill", timeout_s)
            return


def _clone(tree):
    return pytree.tree_map(lambda t: None if t is None else t.clone(), tree)
