"""The runtime base: one training loop, restore, checkpointing, logging and shutdown.

A runtime turns a TrainConfig (and a RunDir) into a trained agent. `Runtime` owns what every
runtime does the same way; a subclass says only how segments arrive and how weights leave.

What the base owns
------------------
- seeding (`seed_everything(cfg.run.seed)`) and the learner's torch threads, in `__init__`;
- the learner's agent on `cfg.runtime.device` and its `Learner` (optimiser, schedule), set up by
  `self.set_agent(agent)`, which the subclass calls once with a CPU agent it built;
- `restore(payload)` (weights, optimiser, counters, then the subclass's part),
  `checkpoint(tracker)` (one payload, every tensor on the CPU), `train()` (the loop below),
  the clean stop on SIGINT / SIGTERM (finish the update, checkpoint, raise
  TrainingInterrupted), the Tracker (metrics.csv, TensorBoard, progress) and the call of
  `close()` on every way out;
- `self.version`: the number of weight versions published in this process (0 before the
  first update; +1 after each update, before `publish_weights`). Policy lag is measured in
  these versions.

The loop (`train`)::

    start()
    until the run is done:
        batch = next_batch()                          # Batch(segment, episodes, policy_lag)
        metrics = learner.update(segment_to(batch.segment, device))
        version += 1; publish_weights()
        tracker.record(..., metrics | extra_metrics(), policy_lag=batch.policy_lag)
                                                      # metrics: losses, learner_ms, CUDA peak
        checkpoint every cfg.run.checkpoint_every updates, at the end and on a stop request
    close()                                           # always, also on errors and signals

The interface of a subclass
---------------------------
    name: str                         "serial", "parallel", "ray": written into checkpoints
    __init__(cfg, run=None)           call super().__init__(cfg, run), build a CPU agent
                                      (torch's global RNG is seeded), call set_agent(agent)
    next_batch() -> Batch             required: the next batch of `cfg.segments_per_batch`
                                      segments joined along B (`cat_segments`), on the CPU
                                      or already on `self.device`; the episodes that ended in
                                      them; the mean policy lag of its segments (in versions)
    publish_weights() -> None         required: make `self.agent`'s weights (on `self.device`)
                                      visible to the actors, as CPU tensors
                                      (`self.agent_state_cpu()` gives them); called after
                                      each update and after a restore
    start() -> None                   optional: start the actors (called once, inside the
                                      stop guard, after `restore`, before the first batch)
    runtime_state() -> dict           optional: extra checkpoint entries (e.g. actor states),
                                      CPU tensors and plain data
    restore_runtime_state(payload)    optional: read them back on `--resume`
    extra_metrics() -> dict           optional: extra metrics.csv columns (e.g.
                                      {"actor_restarts": n}; a new column also goes into
                                      run_dir.COLUMNS)
    end_of_run() -> None              optional: called after the last update, before its
                                      metrics row (ray: takes stock of missing actors)
    close() -> None                   optional: stop every actor and free what they hold;
                                      must be idempotent and must not wait without a timeout

Errors: an actor that fails for good raises `ActorError` from `next_batch` (one line naming
the actor; `.traceback` holds the actor's traceback when it raised); the loop writes a
checkpoint of the last complete update and re-raises; `r2ac train` prints the traceback (if
any) and the line, and exits 1.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig, to_dict
from r2ac.rl.learning.actor import EpisodeLog, Segment
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.agent import Agent
from r2ac.rl.model.build import seed_everything
from r2ac.rl.run.loop import TrainingDiverged, TrainingLoop, rng_state
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.run.tracker import Tracker
from r2ac.runs.values import (
    ValueMismatch,
    check_count,
    check_like,
    check_optimizer,
    check_weights,
)


class ActorError(RuntimeError):
    """An actor failed for good: it raised, died past its restarts, or fell silent. The
    message is one line naming it; `traceback` is the actor's own, when it raised."""

    def __init__(self, message: str, traceback: str | None = None):
        super().__init__(message)
        self.traceback = traceback


@dataclass(frozen=True)
class Batch:
    """What a runtime hands the learner for one update."""

    segment: Segment  # cfg.runtime.batch_size streams, joined along B
    episodes: list[EpisodeLog]  # episodes that ended in these segments (for logging)
    policy_lag: float  # mean over its segments of (learner version - version that acted)


def load_agent_weights(agent: torch.nn.Module, state_dict: dict, source) -> None:
    """`state_dict` into `agent` after checking its values (shapes, dtypes, finite, real):
    ConfigError naming `source` for weights that do not fit or are not finite."""
    try:
        check_weights(state_dict, agent.state_dict(), "agent")
    except ValueMismatch as exc:
        raise ConfigError(f"{source}: weights refused: {exc}") from exc
    try:
        agent.load_state_dict(state_dict)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise ConfigError(
            f"{source}: checkpoint does not match the config: {' '.join(first[:3])[:400]}"
        ) from exc


def to_cpu(tree):
    """Every tensor of a nested structure on the CPU (a checkpoint readable without a GPU)."""
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, tree)


def segment_to(seg: Segment, device: torch.device) -> Segment:
    """The segment with every tensor on `device`, its core start state (with the RTRL
    sensitivities) included; the segment itself when it is there already."""
    first = seg.obs
    if first.device == device:
        return seg
    return pytree.tree_map(lambda t: None if t is None else t.to(device, non_blocking=True), seg)


@torch.no_grad()
def copy_weights(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """dst's parameters and buffers := src's (across devices), in place."""
    for d, s in zip(dst.state_dict().values(), src.state_dict().values(), strict=True):
        d.copy_(s)


class Runtime(TrainingLoop):
    """The batched trainer's loop and bookkeeping; see the module docstring for the interface."""

    name = "base"
    # On the CPU the actors of one process may act with the learner's own modules; a test
    # sets this False to run the separate-copy path a GPU learner takes.
    share_agent_on_cpu = True

    def __init__(self, cfg: TrainConfig, run: RunDir | None = None):
        super().__init__(cfg, run)
        seed_everything(cfg.run.seed)
        if cfg.runtime.num_threads:
            torch.set_num_threads(cfg.runtime.num_threads)
        self.device = torch.device(cfg.runtime.device)
        self.version = 0

    # -- set up by the subclass

    def set_agent(self, agent: Agent) -> Agent:
        """The learner's agent (`agent` itself, or a copy on `self.device`) and its Learner;
        returns the agent the actors of this process act with (on the CPU)."""
        separate = self.device.type != "cpu" or not self.share_agent_on_cpu
        self.agent = copy.deepcopy(agent).to(self.device) if separate else agent
        self.learner = Learner(self.agent, self.cfg)
        return agent

    # -- the subclass's part (see the module docstring)

    def start(self) -> None:
        pass

    def next_batch(self) -> Batch:
        raise NotImplementedError

    def publish_weights(self) -> None:
        raise NotImplementedError

    def runtime_state(self) -> dict:
        return {}

    def restore_runtime_state(self, payload: dict) -> None:
        pass

    def extra_metrics(self) -> dict[str, float]:
        return {}

    def end_of_run(self) -> None:
        pass

    def close(self) -> None:
        pass

    # -- owned by the base

    def agent_state_cpu(self) -> dict[str, torch.Tensor]:
        """The learner's weights as CPU tensors (the agent's own tensors on the CPU)."""
        return {k: v.detach().cpu() for k, v in self.agent.state_dict().items()}

    def cpu_agent(self) -> Agent:
        """An agent on the CPU with the learner's current weights (for the evaluation)."""
        return self.agent if self.device.type == "cpu" else copy.deepcopy(self.agent).cpu()

    def check_payload(self, payload: dict) -> None:
        """ValueMismatch unless every value of a training checkpoint fits this runtime (built
        from the run's config): weights, optimiser, schedule, RNG states, counters and the
        runtime's own part; nothing is changed."""
        check_weights(payload["agent"], self.agent.state_dict(), "agent")
        if "learner" not in payload:
            raise ValueMismatch("learner: missing (a streaming run's checkpoint?)")
        saved, own = payload["learner"], self.learner.state_dict()
        check_optimizer(saved["optimizer"], self.learner.optimizer, "learner.optimizer")
        for key in ("scheduler", "generator", "entropy_boost"):
            if key in saved:
                check_like(saved[key], own[key], f"learner.{key}")
        check_like(payload["rng"], rng_state(), "rng")
        self._check_counters(payload["counters"])
        self.check_runtime_state(payload)

    def _check_counters(self, counters: dict) -> None:
        """Counters within the run's bounds and consistent with each other."""
        total = self.cfg.updates_total
        per_update = self.cfg.runtime.unroll_length * self.cfg.runtime.batch_size
        update = check_count(counters.get("update", 0), "counters.update", 0, total)
        if "frames" in counters:
            frames = check_count(counters["frames"], "counters.frames", 0)
            if frames != update * per_update:
                raise ValueMismatch(
                    f"counters.frames: {frames:,}, expected updates x frames per update = "
                    f"{update:,} x {per_update:,} = {update * per_update:,}"
                )
        if "episodes" in counters:
            check_count(counters["episodes"], "counters.episodes", 0)
        for key in ("returns", "lengths", "lags"):
            for i, value in enumerate(counters.get(key, ())):
                check_like(value, 0.0, f"counters.{key}[{i}]")
        if "elapsed" in counters:
            check_like(counters["elapsed"], 0.0, "counters.elapsed")
            if counters["elapsed"] < 0:
                raise ValueMismatch(f"counters.elapsed: {counters['elapsed']!r}, expected >= 0")

    def check_runtime_state(self, payload: dict) -> None:
        """The runtime's part of a checkpoint against what this runtime holds now: one actor
        state per actor, each of the form of its actor's own (the env's state is left to
        the env); the restart count a non-negative integer."""
        own = self.runtime_state()
        if "actor_restarts" in payload:
            check_count(payload["actor_restarts"], "actor_restarts", 0)
        if "actors" in own and "actors" in payload:
            saved = payload["actors"]
            if len(saved) != len(own["actors"]):
                raise ValueMismatch(
                    f"actors: {len(saved)} actor states, expected one per actor "
                    f"({len(own['actors'])})"
                )
            for i, (s, o) in enumerate(zip(saved, own["actors"], strict=True)):
                check_like(s, {**o, "env": None}, f"actors[{i}]")

    def restore(self, payload: dict, source=None) -> None:
        """The checkpoint `payload` (read from `source`) into this runtime, once all of its
        values are checked (ConfigError naming `source` otherwise: nothing is changed)."""
        if source is None:
            source = self.run.checkpoint_path if self.run else "checkpoint"
        try:
            self.check_payload(payload)
        except ValueMismatch as exc:
            raise ConfigError(f"{source}: does not fit the run's config: {exc}") from exc
        load_agent_weights(self.agent, payload["agent"], source)
        self.learner.load_state_dict(payload["learner"])  # optimiser state moves to the device
        self.saved_counters = payload["counters"]
        self.publish_weights()
        self.restore_runtime_state(payload)

    def checkpoint(self, tracker: Tracker) -> None:
        if self.run is None:
            return
        tracker.flush()  # the rows up to this update are on disk before the checkpoint is
        payload = {
            "agent": self.agent_state_cpu(),
            "learner": to_cpu(self.learner.state_dict()),
            "rng": rng_state(),
            "counters": tracker.state(),
            "config": to_dict(self.cfg),
            "runtime": self.name,
            **self.runtime_state(),
        }
        self.run.save_checkpoint(payload)

    def step(self, tracker: Tracker) -> None:
        """One update; on an ActorError a checkpoint of the last complete update first."""
        try:
            self._update(tracker)
        except ActorError:
            self.checkpoint(tracker)
            raise

    @classmethod
    def memory_estimate(cls, cfg: TrainConfig) -> dict[str, tuple[int, str]]:
        """Bytes the run will hold, by part, each with the options that size it."""
        from r2ac.rl.runtimes.memory import estimate

        return estimate(cfg)

    @classmethod
    def evaluate_saved(cls, run: RunDir, cfg: TrainConfig, sets, episodes, greedy, seed) -> dict:
        """`r2ac eval`: the evaluation protocol on the run's final weights (agent.pt)."""
        import os

        from r2ac.rl.model.build import agent_for_env, make_env
        from r2ac.rl.run.evaluation import evaluate
        from r2ac.rl.run.run_dir import agent_weights

        if not os.path.lexists(run.agent_path):  # a FIFO or a link is named by the loader
            raise ConfigError(f"{run.path}: no weights at {run.agent_path}")
        weights = agent_weights(run.agent_path)  # the file is checked before the env is built
        env = make_env(cfg, 1, 0)
        agent = agent_for_env(cfg, env, load_stem=False)
        env.close()
        load_agent_weights(agent, weights, run.agent_path)
        return evaluate(agent, cfg, sets, episodes, greedy, seed)

    def evaluate(self, sets: int, episodes: int, greedy: bool) -> dict:
        """The evaluation protocol on the learner's current weights (r2ac eval's)."""
        from r2ac.rl.run.evaluation import evaluate

        return evaluate(self.cpu_agent(), self.cfg, sets, episodes, greedy)

    def _check_finite(self, metrics: dict[str, float], update: int) -> None:
        """TrainingDiverged if update `update` left a non-finite loss or weights (their norm
        overflowing float32 counts), before the actors or a checkpoint see them."""
        norms = torch.stack([p.detach().float().norm() for p in self.learner.params])
        if math.isfinite(metrics["loss"]) and bool(torch.isfinite(norms).all()):
            return
        raise TrainingDiverged(
            f"training diverged at update {update}: loss {metrics['loss']:g}, weights "
            f"{'finite' if bool(torch.isfinite(norms).all()) else 'no longer finite'} "
            f"(is --learning-rate {self.cfg.optim.learning_rate:g} too large?)"
        )

    def _update(self, tracker: Tracker) -> None:
        """One batch, one learner update, the new weights published, one metrics record."""
        batch = self.next_batch()
        started = time.perf_counter()
        metrics = self.learner.update(segment_to(batch.segment, self.device))
        # float() of the losses inside update() waits for the device: this is its time too
        metrics["learner_ms"] = 1e3 * (time.perf_counter() - started)
        if self.device.type == "cuda":
            metrics["learner_cuda_peak_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        self._check_finite(metrics, tracker.update + 1)
        self.version += 1
        self.publish_weights()
        if tracker.update + 1 >= self.cfg.updates_total:
            self.end_of_run()  # the last row says how the run ended
        metrics.update(self.extra_metrics())
        frames = self.cfg.runtime.unroll_length * self.cfg.runtime.batch_size
        tracker.record(frames, batch.episodes, metrics, policy_lag=batch.policy_lag)
