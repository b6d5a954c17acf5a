"""The streaming agents' trainer (`r2ac train stream-ac | stream-q`): K agents in lockstep, one
process, an update after every step, on the shared training loop (r2ac/rl/run/loop.py).

Agent k has its own env stream (seed + k), weights (drawn from seed + k), traces, core state,
observation and reward normalisers and sampler (a counter hash of seed + k and the step), so
K agents together equal K runs alone. One lockstep step is one update (of every agent); its
frames are K; `--total-frames` counts each agent's steps.

Around it the batched trainer's product: the run directory, metrics.csv and TensorBoard,
progress with ETA, atomic checkpoints every `checkpoint_every` steps and at the end, bit-exact
resume (weights, traces, core states with their sensitivities, normalisers, counters, the envs'
states; a backend without get_state restarts its episodes on resume, with a warning, and the
agents' traces are reset with them), SIGINT / SIGTERM stop after the current step with a
checkpoint, and the greedy evaluation at the end.

The checkpoint's own section, `stream`: the algorithm, the agents' `state_dict` and the layout
of the pair cores' sensitivities; checkpoints of older versions (the state under
learner.optimizer.state, QRC's under stream AC's keys, sensitivities in pairs) are converted on
restore.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig, to_dict
from r2ac.rl.learning.actor import EpisodeLog
from r2ac.rl.model.build import seed_everything
from r2ac.rl.run.loop import TrainingDiverged, TrainingLoop, rng_state, set_rng_state
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.run.tracker import ProgressLines, Tracker
from r2ac.rl.stream import checkpoint as ckpt
from r2ac.rl.stream.build import make_stream_agent, memory_estimate
from r2ac.rl.stream.envs import agent_seeds, make_agent_envs, stream_env, tensor_form
from r2ac.rl.stream.evaluate import evaluate_agents
from r2ac.runs.plain import from_numpy, to_numpy
from r2ac.runs.values import ValueMismatch, check_like

log = logging.getLogger(__name__)


# metrics.csv's columns after the batched trainer's: stream AC's (mean |TD error|, the ObGD
# step sizes of actor and critic) and QRC's (mean Q, epsilon, mean h, share of non-greedy steps),
# intentional Q(lambda)'s step size
STREAM_COLUMNS = (
    "td_abs",
    "step_actor",
    "step_critic",
    "q_mean",
    "epsilon",
    "h_mean",
    "non_greedy",
    "step_q",
)


class StreamTracker(Tracker):
    """The Tracker with its progress total in agent-steps (K x total_frames) and the
    streaming metrics in metrics.csv."""

    columns = (*Tracker.columns, *STREAM_COLUMNS)

    def __init__(self, cfg, run, saved, num_agents: int):
        self.num_agents = num_agents
        super().__init__(cfg, run, saved)

    def _make_bar(self):
        bar = super()._make_bar()
        if bar is not None:
            bar.total = self.cfg.run.total_frames * self.num_agents
            if not isinstance(bar, ProgressLines):
                bar.refresh()
        return bar


class StreamRuntime(TrainingLoop):
    """K streaming agents of `cfg.loss.algorithm` and their envs, trained step by step."""

    name = "stream"

    def __init__(self, cfg: TrainConfig, run: RunDir | None = None, dtype=torch.float32):
        super().__init__(cfg, run)
        seed_everything(cfg.run.seed)
        if cfg.runtime.num_threads:
            torch.set_num_threads(cfg.runtime.num_threads)
        self.k = cfg.stream.num_agents
        self.seeds = agent_seeds(cfg.run.seed, self.k)
        self.env = make_agent_envs(cfg, self.seeds)
        # the compiled step runs a built-in env with a tensor form inside its graph
        self.env = (cfg.stream.compile_step and tensor_form(self.env)) or self.env
        self.fused = self.loop = None
        try:
            self.agent = make_stream_agent(cfg, self.env, self.seeds, dtype)
            self.agent.observe_first(self.env.reset())
            if cfg.stream.compile_step:
                self._compile()
        except BaseException:
            self.env.close()
            raise
        self.stepper = self.fused or self.agent  # what acts and learns each step
        self._sums = torch.zeros(len(self.agent.metric_names), dtype=torch.float64)
        self._count = 0

    def _compile(self) -> None:
        """The agents' step compiled (r2ac/rl/stream/compiled*.py), now: its time is printed.
        On a tensor env, n steps with the env's a call (`loop`); else one step a call
        (`fused`) beside the env's own step."""
        from r2ac.allocator import preloaded_library
        from r2ac.envs.tensor_builtin import TensorBuiltinEnv
        from r2ac.rl.stream.compiled import FusedStreamAC
        from r2ac.rl.stream.compiled_loop import FusedStreamLoop
        from r2ac.rl.stream.compiled_spec import check_supported

        check_supported(self.agent)
        if isinstance(self.env, TensorBuiltinEnv):
            self.loop = compiled = FusedStreamLoop(self.agent, self.env)
        else:
            self.fused = compiled = FusedStreamAC(self.agent)
        seconds = compiled.warm_up()
        allocator = preloaded_library() or "the C library's (r2ac/allocator.py: jemalloc is faster)"
        log.info("compiled the streaming step in %.1f s; allocator: %s", seconds, allocator)

    def _sync(self) -> None:
        """The compiled step's state written back into the agents (before they are read)."""
        for compiled in (self.fused, self.loop):
            if compiled is not None:
                compiled.sync_to(self.agent)

    # -- what every trainer answers

    @classmethod
    def memory_estimate(cls, cfg: TrainConfig) -> dict[str, tuple[int, str]]:
        """Bytes the K agents hold, by part, from one env stream's sizes."""
        env = stream_env(cfg, 1, cfg.run.seed)
        try:
            obs_size = int(np.prod(env.observation_spec.shape))
            action_size = env.action_space.head_size
        finally:
            env.close()
        return memory_estimate(cfg, obs_size, action_size)

    def make_tracker(self) -> Tracker:
        return StreamTracker(self.cfg, self.run, self.saved_counters, self.k)

    def checkpoint(self, tracker: Tracker) -> None:
        if self.run is None:
            return
        self._sync()
        tracker.flush()  # the rows up to this step are on disk before the checkpoint is
        self.run.save_checkpoint(self._payload(tracker))

    def _payload(self, tracker: Tracker) -> dict:
        try:
            env_state = from_numpy(self.env.get_state())  # plain data: its arrays as tensors
        except NotImplementedError:
            env_state = None
        return {
            "agent": self.agent.weights(),
            "stream": ckpt.section(
                self.cfg.loss.algorithm, self.agent.state_dict(), self._sums, self._count
            ),
            "rng": rng_state(),
            "counters": tracker.state(),
            "config": to_dict(self.cfg),
            "runtime": self.name,
            "env": env_state,
        }

    def restore(self, payload: dict, source=None) -> None:
        """The checkpoint into the agents and envs, once every value is checked against what
        this config builds (ConfigError naming the field otherwise: nothing is changed)."""
        source = source or (self.run.checkpoint_path if self.run else "checkpoint")
        try:
            saved = ckpt.agent_state(payload, self.cfg.loss.algorithm)
            check_like(saved, self.agent.state_dict(), "stream.state")
            ckpt.check_counters(payload["counters"], saved["steps"], self.cfg, self.k)
            check_like(payload["rng"], rng_state(), "rng")
            sums, count = ckpt.metric_sums(payload, self._sums, self.cfg.run.log_every)
        except ValueMismatch as exc:
            raise ConfigError(f"{source}: does not fit the run's config: {exc}") from exc
        self.agent.load_state_dict(saved)
        self._sums, self._count = sums, count
        self.saved_counters = payload["counters"]
        set_rng_state(payload["rng"])
        if payload.get("env") is not None:
            self._set_env_state(payload["env"], source)
        else:  # a backend without get_state: fresh episodes, the agents' traces with them
            log.warning("env %s has no get_state: resumed runs restart episodes", self.cfg.env.id)
            self.agent.observe_first(self.env.reset())
            self.agent.restart_episodes()
        for compiled in (self.fused, self.loop):  # it goes on from the restored agents
            if compiled is not None:
                from r2ac.rl.stream.compiled_spec import state_of

                compiled.load(state_of(self.agent))

    def _set_env_state(self, state, source) -> None:
        """The envs' saved state, or one line naming the file when it does not fit them."""
        try:
            self.env.set_state(to_numpy(state))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            detail = (str(exc).strip().splitlines() or [""])[0][:160]
            raise ConfigError(
                f"{source}: the envs' saved state does not fit them ({type(exc).__name__}: {detail})"
            ) from exc

    def evaluate(self, sets: int, episodes: int, greedy: bool) -> dict:
        self._sync()
        return evaluate_agents(self.agent, self.cfg, self.seeds, sets, episodes, greedy)

    @classmethod
    def evaluate_saved(cls, run: RunDir, cfg: TrainConfig, sets, episodes, greedy, seed) -> dict:
        """`r2ac eval`: the K agents as the run's last checkpoint left them (weights and
        normalisers, which agent.pt alone does not restore), frozen; agent k plays with seed
        `seed + k` (default: the run's seed)."""
        if not os.path.lexists(run.checkpoint_path):
            raise ConfigError(f"{run.path}: no checkpoint at {run.checkpoint_path}")
        if seed is not None:
            cfg = cfg.updated(seed=seed)
        payload = run.load_checkpoint()  # the file is checked before the envs are built
        runtime = cls(cfg.updated(compile_step=False))  # frozen agents play eagerly
        try:
            runtime.restore(payload, run.checkpoint_path)
            return runtime.evaluate(sets, episodes, greedy)
        finally:
            runtime.close()

    def close(self) -> None:
        self.env.close()

    # -- one step

    def step(self, tracker: Tracker) -> None:
        if self.loop is not None:
            self._step_chunk(tracker)
            return
        agent = self.stepper
        action = agent.act()
        res = self.env.step(action.numpy())
        info = agent.learn(
            res.reward, res.obs, res.info["final_obs"], res.terminated, res.truncated
        )
        # |first field| and the others' means, summed in float64
        self._sums += torch.stack([info[0].abs(), *info[1:]]).mean(1)
        self._count += 1
        ended = np.flatnonzero(~np.isnan(res.info["episode_return"]))
        episodes = EpisodeLog(
            [float(res.info["episode_return"][i]) for i in ended],
            [int(res.info["episode_length"][i]) for i in ended],
        )
        metrics = self._metrics(tracker.update + 1) if self._logs_at(tracker.update + 1) else {}
        tracker.record(self.k, [episodes], metrics)

    def _step_chunk(self, tracker: Tracker) -> None:
        """Steps up to the next log, checkpoint or chunk boundary in one compiled call (the
        boundaries fixed by the update counter: a resumed run cuts where this one did)."""
        n = chunk_length(tracker.update, self.cfg, self.loop.nmax)
        sums, episodes = self.loop.run(n)
        self._sums += sums
        self._count += n
        update = tracker.update + n
        metrics = self._metrics(update) if self._logs_at(update) else {}
        tracker.record(self.k * n, [episodes], metrics, updates=n)

    def _logs_at(self, update: int) -> bool:
        return update % self.cfg.run.log_every == 0 or update >= self.cfg.updates_total

    def _metrics(self, update: int) -> dict[str, float]:
        self._sync()
        if not self.agent.finite():
            raise TrainingDiverged(f"training diverged at step {update}: weights not finite")
        mean = (self._sums / max(self._count, 1)).tolist()
        self._sums.zero_()
        self._count = 0
        return {
            **dict(zip(self.agent.metric_names, mean, strict=True)),
            **self.agent.constant_metrics(),
        }


def chunk_length(update: int, cfg: TrainConfig, nmax: int) -> int:
    """Steps from `update` to the next multiple of nmax, log_every or checkpoint_every, or
    to the end of training, whichever comes first."""
    n = min(every - update % every for every in (nmax, cfg.run.log_every, cfg.run.checkpoint_every))
    return min(n, cfg.updates_total - update)
