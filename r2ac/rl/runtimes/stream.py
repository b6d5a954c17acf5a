"""The streaming runtime (`--runtime stream`, `--preset stream`): K stream AC(lambda) agents
in lockstep, one process, an update after every step (r2ac/rl/learning/stream.py).

Agent k has its own env stream (seed + k), weights (drawn from seed + k), traces, core state,
observation and reward normalisers and sampler (a counter hash of seed + k and the step), so
K agents together equal K runs alone. One lockstep step is one "update" (of every agent);
its frames are K; `--total-frames` counts each agent's steps (the run makes that many
updates).

The same product as the batched runtimes around it: the run directory, metrics.csv and
TensorBoard (r2ac.rl.harness.tracker), progress with ETA, atomic checkpoints every
`checkpoint_every` steps and at the end, bit-exact resume (weights, traces, core states with
their sensitivities, normalisers, counters, the envs' states; a backend without get_state
restarts its episodes on resume, with a warning, and the agents' core states and traces
are reset with them), SIGINT / SIGTERM stop after the current step with a checkpoint, and
the greedy evaluation at the end (`evaluate`: weights and normalisers frozen, each agent's
result and their mean).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch

from r2ac.envs.base import ArraySpec, BatchedEnv, StepResult, stream_seeds
from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig, to_dict
from r2ac.rl.harness.run_dir import RunDir
from r2ac.rl.harness.tracker import ProgressLines, Tracker
from r2ac.rl.learning.actor import EpisodeLog
from r2ac.rl.learning.stream import StreamAC, StreamSettings, detach_state
from r2ac.rl.model.build import eval_seed, make_env, seed_everything
from r2ac.rl.model.distributions import action_code, distribution
from r2ac.rl.runtimes.base import TrainingDiverged, rng_state, set_rng_state
from r2ac.runs.stop import StopRequest, TrainingInterrupted
from r2ac.runs.values import check_like

log = logging.getLogger(__name__)

MAX_EVAL_STREAMS = 32


def _value(cfg: TrainConfig, name: str):
    """An option by its flat name, wherever its group keeps it."""
    return cfg.flat()[name]


# ---------------------------------------------------------------- the agents' envs


class ConcatEnvs(BatchedEnv):
    """K single-stream envs as one batched env of K streams (stream k: envs[k])."""

    def __init__(self, envs: list[BatchedEnv]):
        self.envs = envs
        self.num_envs = len(envs)
        self.observation_spec = envs[0].observation_spec
        self.num_actions = getattr(envs[0], "num_actions", 0)
        self._space = envs[0].action_space

    @property
    def action_space(self):
        return self._space

    def reset(self, seed: int | None = None) -> np.ndarray:
        return np.concatenate([e.reset() for e in self.envs])

    def step(self, actions: np.ndarray) -> StepResult:
        results = [e.step(actions[k : k + 1]) for k, e in enumerate(self.envs)]
        info = {
            key: np.concatenate([r.info[key] for r in results])
            for key in ("episode_return", "episode_length", "final_obs")
        }
        return StepResult(
            np.concatenate([r.obs for r in results]),
            np.concatenate([r.reward for r in results]),
            np.concatenate([r.terminated for r in results]),
            np.concatenate([r.truncated for r in results]),
            info,
        )

    def get_state(self):
        return {"envs": [e.get_state() for e in self.envs]}

    def set_state(self, state) -> None:
        for e, s in zip(self.envs, state["envs"], strict=True):
            e.set_state(s)

    def close(self) -> None:
        for e in self.envs:
            e.close()


class PreviousActionInput(BatchedEnv):
    """`env` whose (flattened) observations end with the previous action's code
    (`action_code`: one-hot per categorical, clip(a, -1, 1) for a Box), zeros at an
    episode's first step: `--prev-action` for the streaming agents, which see only the
    observation. A truncated episode's final_obs carries the action that led to it. The
    code goes through the agents' observation normalisation with the rest."""

    def __init__(self, env: BatchedEnv):
        spec = env.observation_spec
        if spec.is_image:
            raise ConfigError("--prev-action: the streaming agent takes vector observations only")
        self.env, self.num_envs = env, env.num_envs
        self.num_actions = getattr(env, "num_actions", 0)
        self._space = env.action_space
        self.obs_size = int(math.prod(spec.shape))
        self.observation_spec = ArraySpec((self.obs_size + self._space.code_size,), np.float32)

    @property
    def action_space(self):
        return self._space

    def _with(self, obs: np.ndarray, code: np.ndarray) -> np.ndarray:
        flat = np.asarray(obs, dtype=np.float32).reshape(self.num_envs, self.obs_size)
        return np.concatenate([flat, code], axis=1)  # (B, obs_size + C)

    def reset(self, seed: int | None = None) -> np.ndarray:
        zeros = np.zeros((self.num_envs, self._space.code_size), np.float32)
        return self._with(self.env.reset(seed), zeros)

    def step(self, actions: np.ndarray) -> StepResult:
        res = self.env.step(actions)
        code = action_code(self._space, torch.as_tensor(actions), torch.float32).numpy()
        done = (res.terminated | res.truncated)[:, None]
        info = {**res.info, "final_obs": self._with(res.info["final_obs"], code)}
        obs = self._with(res.obs, np.where(done, np.float32(0.0), code))
        return StepResult(obs, res.reward, res.terminated, res.truncated, info)

    def get_state(self):
        return self.env.get_state()

    def set_state(self, state) -> None:
        self.env.set_state(state)

    def close(self) -> None:
        self.env.close()


def with_inputs(cfg: TrainConfig, env: BatchedEnv) -> BatchedEnv:
    """`env` with the previous action in the observation under --prev-action."""
    return PreviousActionInput(env) if cfg.model.prev_action else env


def stream_env(cfg: TrainConfig, num_envs: int, seed: int) -> BatchedEnv:
    return with_inputs(cfg, make_env(cfg, num_envs, seed))


def agent_seeds(seed: int, k: int) -> list[int]:
    return [seed + i for i in range(k)]


def make_agent_envs(cfg: TrainConfig, seeds: list[int]) -> BatchedEnv:
    """Stream k is the env `make_env(cfg, 1, seeds[k])` would give: the built-in envs as one
    batched env with each stream's seed set so, other backends as K envs side by side."""
    from r2ac.envs.builtin import _CounterRNGEnv

    env = make_env(cfg, len(seeds), seeds[0])
    if isinstance(env, _CounterRNGEnv):
        env.seeds[:] = [stream_seeds(s, 1)[0] for s in seeds]
        return with_inputs(cfg, env)
    env.close()
    return ConcatEnvs([stream_env(cfg, 1, s) for s in seeds])


# ---------------------------------------------------------------- the agent


def make_agent(cfg: TrainConfig, env: BatchedEnv, seeds, dtype=torch.float32) -> StreamAC:
    """The agents of --streaming: StreamAC (ac) or StreamQRC (q, r2ac/rl/learning/stream_q.py)."""
    from r2ac.rtrl.stacked import make_stacked_core

    spec = env.observation_spec
    if spec.is_image:
        raise ConfigError(f"{cfg.env.id}: the streaming agent takes vector observations only")
    obs_size = int(math.prod(spec.shape))

    def core(k: int, d: int):
        return make_stacked_core(cfg.model.core, k, d, cfg.model.hidden_size, dtype)

    if cfg.stream.streaming == "q":
        from r2ac.rl.learning.stream_q import StreamQRC, settings_from

        settings = settings_from(cfg)
        mlp = cfg.stream.stream_mlp
        top = cfg.stream.stream_top_mlp
        agent = StreamQRC(core, env.action_space, obs_size, seeds, settings, mlp, dtype, top)
        return with_forget_bias(agent, cfg.model.forget_bias)
    settings = StreamSettings(
        discount=cfg.loss.discount,
        trace_lambda=cfg.stream.trace_lambda,
        lr=cfg.optim.learning_rate,
        kappa_actor=cfg.stream.kappa_actor,
        kappa_critic=cfg.stream.kappa_critic,
        entropy_cost=cfg.loss.entropy_cost,
    )
    agent = StreamAC(
        core, env.action_space, obs_size, seeds, settings, cfg.stream.stream_mlp, dtype,
        cfg.stream.stream_top_mlp,
    )  # fmt: skip
    return with_forget_bias(agent, cfg.model.forget_bias)


@torch.no_grad()
def with_forget_bias(agent, forget_bias: float | None):
    """`agent` with every eLSTM core's forget-gate bias b_f set to `forget_bias` (None: the
    core's own init), in both networks, as `--forget-bias` sets the batched agent's."""
    if forget_bias is None:
        return agent
    for net, theta in ((agent.actor, agent.theta_a), (agent.critic, agent.theta_c)):
        views = net.layout.views(theta)
        if "core.b_f" not in views:
            raise ConfigError(f"--forget-bias: core {net.core.name} has no forget gate")
        views["core.b_f"].fill_(forget_bias)
    return agent


# metrics.csv's columns after the batched trainer's: stream AC's (mean |TD error|, the ObGD
# step sizes of actor and critic) and QRC's (mean Q, epsilon, mean h, share of non-greedy steps)
STREAM_COLUMNS = (
    "td_abs",
    "step_actor",
    "step_critic",
    "q_mean",
    "epsilon",
    "h_mean",
    "non_greedy",
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


# The RTU's and LRU's d s / d W1 in a checkpoint: "planes" (K, 2, U, D), the real parts then
# the imaginary ones; checkpoints without the mark hold (K, U, D, 2) pairs.
SENSITIVITY_LAYOUT = "planes"


def pair_sensitivities_as_planes(saved: dict) -> dict:
    """`saved` (an agent's state_dict) with every exact-RTRL pair core's sensitivity of the
    input map moved from (K, U, D, 2) pairs to (K, 2, U, D) planes; other cores unchanged (a
    pair core's state alone is three tensors: the state (K, 2, U), then (K, U, D, 2) pairs)."""

    def is_pairs(state) -> bool:
        return (
            isinstance(state, (list, tuple))
            and len(state) == 3
            and all(isinstance(t, torch.Tensor) for t in state)
            and state[0].dim() == 3
            and state[1].dim() == 4
            and state[1].shape[3] == 2
        )

    out = dict(saved)
    for key in ("core_actor", "core_critic"):
        if is_pairs(state := saved.get(key)):
            h, sens_w, sens_v = state
            out[key] = [h, sens_w.permute(0, 3, 1, 2).contiguous(), sens_v]
    return out


class StreamRuntime:
    """`r2ac train` with `--runtime stream` (the interface train_cli uses of a runtime:
    train, restore, cpu_agent-free `evaluate`)."""

    name = "stream"

    def __init__(self, cfg: TrainConfig, run: RunDir | None = None, dtype=torch.float32):
        self.cfg, self.run = cfg, run
        seed_everything(cfg.run.seed)
        if cfg.runtime.num_threads:
            torch.set_num_threads(cfg.runtime.num_threads)
        self.k = cfg.stream.num_agents
        self.seeds = agent_seeds(cfg.run.seed, self.k)
        self.env = make_agent_envs(cfg, self.seeds)
        try:
            self.agent = make_agent(cfg, self.env, self.seeds, dtype)
            self.agent.observe_first(self.env.reset())
        except BaseException:
            self.env.close()
            raise
        self.saved_counters: dict | None = None
        self._sums = torch.zeros(5, dtype=torch.float64)
        self._log_every = _value(cfg, "log_every")
        self._count = 0

    # -- checkpoints

    def _payload(self, tracker: Tracker) -> dict:
        try:
            env_state = self.env.get_state()
        except NotImplementedError:
            env_state = None
        s = self.cfg.stream
        group = {"lr": self.cfg.optim.learning_rate, "trace_lambda": s.trace_lambda,
                 "kappa_actor": s.kappa_actor, "kappa_critic": s.kappa_critic}  # fmt: skip
        return {
            "agent": self.agent.weights(),
            # ObGD is the optimiser: its state is the traces (and all else a step carries)
            "learner": {
                "optimizer": {"state": self.agent.state_dict(), "param_groups": [group]},
                "scheduler": {},
            },
            "rng": rng_state(),
            "counters": tracker.state(),
            "config": to_dict(self.cfg),
            "runtime": self.name,
            "env": env_state,
            "sensitivity_layout": SENSITIVITY_LAYOUT,
        }

    def checkpoint(self, tracker: Tracker) -> None:
        if self.run is None:
            return
        tracker.flush()
        self.run.save_checkpoint(self._payload(tracker))

    def restore(self, payload: dict) -> None:
        if payload.get("runtime") != self.name:
            raise ConfigError(
                f"checkpoint of runtime {payload.get('runtime')!r}, not a streaming one"
            )
        saved = payload["learner"]["optimizer"]["state"]
        if payload.get("sensitivity_layout") != SENSITIVITY_LAYOUT:
            saved = pair_sensitivities_as_planes(saved)
        # every value against what this config builds, before any is used
        check_like(saved, self.agent.state_dict(), "learner.optimizer.state")
        steps, total = saved["steps"], self.cfg.run.total_frames
        if not 0 <= steps <= total:
            raise ConfigError(f"learner.optimizer.state.steps: {steps}, expected 0..{total}")
        self.agent.load_state_dict(saved)
        self.saved_counters = payload["counters"]
        set_rng_state(payload["rng"])
        if payload.get("env") is not None:
            self.env.set_state(payload["env"])
        else:  # a backend without get_state: fresh episodes, the agents' memories with them
            log.warning("env %s has no get_state: resumed runs restart episodes", self.cfg.env.id)
            self.agent.observe_first(self.env.reset())
            self.agent.z_a.zero_()
            self.agent.z_c.zero_()
            if hasattr(self.agent, "z_b"):  # QRC's trace of h's values
                self.agent.z_b.zero_()

    # -- training

    def train(self) -> Tracker:
        cfg = self.cfg
        with StopRequest() as stop:
            tracker = StreamTracker(cfg, self.run, self.saved_counters, self.k)
            try:
                every = _value(cfg, "checkpoint_every")
                total = cfg.updates_total
                while tracker.update < total:
                    self._step(tracker)
                    if tracker.update % every == 0 or tracker.update >= total or stop.requested:
                        self.checkpoint(tracker)
                    if stop.requested:
                        raise TrainingInterrupted(stop.signum, tracker.update, self.run is not None)
            finally:
                try:
                    self.close()
                finally:
                    tracker.close()
        return tracker

    def _step(self, tracker: Tracker) -> None:
        agent = self.agent
        action = agent.act()
        res = self.env.step(action.numpy())
        info = agent.learn(
            res.reward, res.obs, res.info["final_obs"], res.terminated, res.truncated
        )
        # StepInfo (ac) or QStepInfo (q): |delta| and four means
        self._sums += torch.stack([info[0].abs(), *info[1:]]).mean(1)  # (5,), summed in float64
        self._count += 1
        ended = np.flatnonzero(~np.isnan(res.info["episode_return"]))
        episodes = EpisodeLog(
            [float(res.info["episode_return"][i]) for i in ended],
            [int(res.info["episode_length"][i]) for i in ended],
        )
        metrics = {}
        due = (tracker.update + 1) % self._log_every == 0
        if due or tracker.update + 1 >= self.cfg.updates_total:
            metrics = self._metrics(tracker.update + 1)
        tracker.record(self.k, [episodes], metrics)

    def _metrics(self, update: int) -> dict[str, float]:
        a = self.agent
        finite = bool(torch.isfinite(a.theta_a).all() and torch.isfinite(a.theta_c).all())
        if not finite:
            raise TrainingDiverged(f"training diverged at step {update}: weights not finite")
        mean = (self._sums / max(self._count, 1)).tolist()
        self._sums.zero_()
        self._count = 0
        if self.cfg.stream.streaming == "q":
            names = ("td_abs", "q_mean", "epsilon", "h_mean", "non_greedy")
            return {**dict(zip(names, mean, strict=True)), "lr": self.cfg.optim.learning_rate}
        return {
            "td_abs": mean[0],
            "value_mean": mean[1],
            "entropy": mean[2],
            "step_actor": mean[3],
            "step_critic": mean[4],
            "lr": self.cfg.optim.learning_rate,
            "entropy_cost": self.cfg.loss.entropy_cost,
        }

    def close(self) -> None:
        self.env.close()

    # -- evaluation

    def evaluate(self, sets: int, episodes: int, greedy: bool) -> dict:
        """Each agent's frozen policy (its normalisers frozen too) on `sets` seeded sets of
        `episodes` episodes (set s of agent k: env seed eval_seed(seed + k, s))."""
        start, steps, per_agent = time.perf_counter(), 0, []
        for k in range(self.k):
            means = []
            for s in range(sets):
                seed = eval_seed(self.seeds[k], s)
                env = stream_env(self.cfg, min(episodes, MAX_EVAL_STREAMS), seed)
                try:
                    returns, n = play_agent(self.agent, k, env, episodes, greedy, seed)
                finally:
                    env.close()
                means.append(float(np.mean(returns)))
                steps += n
            per_agent.append(
                {"seed": self.seeds[k], "mean": float(np.mean(means)), "set_means": means}
            )
        agent_means = [a["mean"] for a in per_agent]
        return {
            "env": self.cfg.env.id,
            "core": self.cfg.model.core,
            "sets": sets,
            "episodes_per_set": episodes,
            "actions": "greedy" if greedy else "sampled",
            "seed": self.cfg.run.seed,
            "mean": float(np.mean(agent_means)),
            "std": float(np.std(agent_means)),
            "num_agents": self.k,
            "agents": per_agent,
            "frames": steps,
            "seconds": time.perf_counter() - start,
        }


@torch.no_grad()
def play_agent(agent: StreamAC, k: int, env, episodes: int, greedy: bool, seed: int):
    """Agent k's policy (no learning) on env's B streams: the returns of exactly `episodes`
    complete episodes (stream quotas, as r2ac eval), and the steps taken."""
    from r2ac.rl.learning.stream import normalise_obs, sample_actions, sample_draws, uniforms

    b = env.num_envs
    net = agent.actor.resized(b)
    theta = agent.theta_a.detach()[k : k + 1].expand(b, -1).contiguous()
    stats = type(agent.obs_stats)(*(t[k : k + 1] for t in agent.obs_stats))
    quota = np.array([episodes // b + (i < episodes % b) for i in range(b)])
    returns: list[list[float]] = [[] for _ in range(b)]
    sampler = np.array([seed * 1000 + i for i in range(b)], dtype=np.uint64)
    state, reset = net.core.initial_state(), torch.ones(b, dtype=torch.bool)
    obs, steps = env.reset(seed=seed), 0
    while any(len(r) < q for r, q in zip(returns, quota)):
        x = normalise_obs(stats, torch.as_tensor(obs).to(torch.float64).reshape(b, -1))
        params, state = net.step(theta, x.to(agent.dtype), state, reset)
        if greedy:
            action = distribution(agent.space, params).mode()
        else:
            u = torch.from_numpy(uniforms(sampler, steps, sample_draws(agent.space)))
            action = sample_actions(agent.space, params, u)
        state = detach_state(state)
        res = env.step(action.numpy())
        steps += 1
        for i in np.flatnonzero(~np.isnan(res.info["episode_return"])):
            if len(returns[i]) < quota[i]:
                returns[i].append(float(res.info["episode_return"][i]))
        obs = res.obs
        reset = torch.from_numpy(np.asarray(res.terminated | res.truncated, dtype=bool))
    return [x for r in returns for x in r], steps * b
