"""The typed training config, in groups, and its validation (the CLI is generated from it).

`TrainConfig` holds one frozen dataclass per group: env, model, loss, optim, runtime, run;
`r2ac train --help` shows one section per group, with the flags of a flat config
(`--learning-rate`, not `--optim.learning-rate`). Code reads `cfg.optim.learning_rate`;
`TrainConfig.make(**flat)` and `cfg.updated(**flat)` take the flat option names, and
`from_dict` reads both the grouped config.json and the flat one of runs written before the
groups. Named configs live in r2ac.rl.presets.

One frame = one agent step of one env stream (after action repeat), the unit of
`total_frames`, of frames/s and of the learning-rate decay. Configs are frozen: derived
values are properties, nothing is mutated while training.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import tyro

from r2ac.envs.registry import DEFAULT_ENV, parse_options
from r2ac.errors import ConfigError


@dataclass(frozen=True)
class EnvConfig:
    """The task: which env, with which options."""

    id: Annotated[str, tyro.conf.arg(name="env")] = DEFAULT_ENV
    """Env name `<family>/<task>` (see `r2ac envs`)."""
    options: Annotated[tuple[str, ...], tyro.conf.arg(name="env-options")] = ()
    """Env options as key=value pairs, e.g. delay=64 (typed by the env's constructor)."""


@dataclass(frozen=True)
class ModelConfig:
    """The agent: stem -> core([features, last reward, previous action]) -> heads."""

    core: str = "elstm-rtrl"
    """Core name: `feedforward` or any `<core>-<rule>` of r2ac.rtrl (e.g. elstm-rtrl, elstm-bptt)."""
    hidden_size: int = 64
    """Core state size N."""
    forget_bias: float | None = None
    """Initial forget-gate bias b_f of eLSTM cores (None: the core's own default, 1)."""
    stem_features: int = 64
    """Output features of the stem (the core input is these plus the clipped last reward)."""
    head_hidden: int = 0
    """Width of a ReLU layer between the core and the policy / value heads, shared by both
    (POPGym's baselines decode the memory's output with an MLP); 0: linear heads."""
    freeze_stem: bool = False
    """Freeze the stem (no gradients): a pre-trained one, or a random one for the built-in tasks."""
    stem_norm: bool = False
    """LayerNorm on the stem's features before the core (the reward and action inputs are
    left as they are). Why: nothing else bounds the features' scale, and an eLSTM trained by
    exact RTRL under the policy gradient lets it grow until its gates saturate (f -> 0 or 1)
    and its memory is lost (docs/rl.md, "The stem's scale")."""
    prev_action: bool = False
    """Feed the previous action (one-hot, zeros at an episode start) to the core, as POPGym's
    baselines do (their `PreviousAction` wrapper)."""
    last_reward: bool = True
    """Feed the last reward to the core. Off for masked control tasks, whose rewards carry
    what the mask hides (HalfCheetah's reward is its forward velocity; Pendulum's holds the
    angular speed): a memoryless agent seeing it is no longer memoryless."""
    mlp_hidden: tuple[int, ...] = (64,)
    """Hidden layer sizes of the MLP stem (vector observations)."""
    conv_channels: tuple[int, ...] = (16, 32, 32)
    """Channels of the three ResNet stages (image observations)."""
    image_stem: str = "resnet"
    """Stem for image observations: `resnet` (IMPALA's deep one, the paper's) or `shallow`
    (IMPALA's two-conv one, cheap enough for Atari on a CPU)."""
    obs_norm: bool = False
    """Standardise flat float observations by the running mean and variance of the learner's
    batches, clipped to +-5, before the stem (Sample Factory's normalize_input;
    r2ac/rl/model/obs_norm.py). On in `--preset popgym`; off, the agent and its checkpoints
    are as without it."""
    chrono_span: int = 0
    """eLSTM / feLSTM cores: chrono init of the forget-gate biases, b_f = log(U(1, span - 1))
    per cell, memory time scales spread over 2..span steps (Tallec & Ollivier 2018; the copy
    task's --chrono-init); 0: off (every b_f the same, --forget-bias or the core's 1)."""
    load_stem: str | None = None
    """Weights-only agent checkpoint (e.g. RUN/checkpoints/agent.pt) to load the stem from."""


@dataclass(frozen=True)
class LossConfig:
    """The learning signal: segments, returns, targets (V-trace or GAE) and the losses
    (IMPALA's sums or PPO's clipped means)."""

    discount: float = 0.99
    """Discount gamma."""
    reward_clip: float = 1.0
    """Clip the rewards to [-reward_clip, reward_clip] before scaling them, in the losses and
    in the core's last-reward input (1: IMPALA's [-1, 1]; 0: no clipping, e.g. for
    continuous control, whose rewards are then scaled with reward_scale)."""
    reward_scale: float = 1.0
    """Multiply the clipped rewards by this, in the losses (the value targets scale with it)
    and in the core's last-reward input."""
    popart: bool = False
    """PopArt value normalisation: the value head learns normalised returns and the losses
    divide value errors and advantages by the running std of the V-trace targets, so that
    tasks with tiny rewards (POPGym: +-1/51 per step) train like tasks with unit rewards."""
    entropy_cost: float = 0.01
    """Weight of the entropy regulariser."""
    entropy_floor: float = 0.0
    """A floor (nats) under the policy's mean entropy per step; 0: none. Below it the learner
    raises the entropy cost by dual ascent (0.01 per nat of deficit and
    optimiser step), above it lowers the raise again to 0, so that a policy cannot go
    deterministic before it has anything to be sure of. The floor follows the learning-rate
    schedule (with --lr-decay it falls to 0 with it). docs/rl.md, "An entropy floor"."""
    entropy_floor_cap: float = 0.0
    """With --entropy-floor: the floor is at most this fraction of the largest entropy the
    action space allows (the uniform policy's: ln n for Discrete(n), summed over the
    components of MultiDiscrete and MultiBinary; a Box has none, so no cap); 0: no cap. A floor
    at or above that largest entropy can never be met, and its dual ascent then raises the
    entropy cost without end (to 18 after 1 M frames on POPGym's two-action envs under a floor
    of 0.8 nats, holding the policy at uniform). docs/rl.md, "An entropy floor"."""
    popart_sigma_floor: float = 0.0
    """With popart: divide the advantages by max(sigma, this) (the
    critic still by sigma). 0: by sigma, PopArt's form. A floor stops the policy gradient
    from growing as 1/sigma when an accurate critic sees a small spread of returns
    (docs/rl.md, "Diagnosing a run")."""
    baseline_cost: float = 0.5
    """Weight of the baseline loss."""
    value_clip: float = 0.0
    """PPO's value clip (on normalised values with PopArt); 0: no value clipping."""
    algorithm: Literal["impala", "ppo", "stream-ac", "stream-q"] = "impala"
    """The learning algorithm, set by `r2ac train`'s subcommand: impala (V-trace
    actor-critic, losses summed over steps), ppo (the PPO-clip objective against the
    behaviour policy, advantages standardised per minibatch, losses as means), stream-ac and
    stream-q (the streaming agents: r2ac/rl/stream/, an update every step)."""
    targets: Literal["vtrace", "gae"] = "vtrace"
    """PPO's value targets and advantages: V-trace's, or GAE(gae_lambda)'s (fixed per batch)."""
    gae_lambda: float = 0.95
    """GAE's lambda (with --targets gae)."""
    clip_coef: float = 0.2
    """PPO's ratio clip epsilon."""


@dataclass(frozen=True)
class OptimConfig:
    """The optimiser, its learning-rate schedule and its passes over each batch."""

    learning_rate: float = 6e-4
    """RMSProp learning rate."""
    lr_decay: bool = False
    """Decay the learning rate linearly to 0 over total_frames (--no-lr-decay: constant)."""
    grad_clip: float = 40.0
    """Global gradient-norm clipping threshold."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """Optimiser: rmsprop (IMPALA's: alpha 0.99, eps 0.01) or adam (default betas, adam_eps)."""
    adam_eps: float = 1e-8
    """Adam's epsilon (with --optimizer adam)."""
    epochs: int = 1
    """Passes over each batch (each re-runs the core from the segments' start states)."""
    minibatches: int = 1
    """Minibatches per pass: disjoint sets of whole streams (batch_size must divide by it)."""
    rtrl_start_correction: bool = False
    """With an eLSTM RTRL core and several passes: each step after the batch's first starts
    its segments from c(t0) + S(t0) . (theta - theta before the passes), the stored start
    state moved to first order by the updates so far (docs/rules/passes.md)."""
    lr_warmup_updates: int = 0
    """Ramp the learning rate linearly from 0 over this many updates (0: none)."""


@dataclass(frozen=True)
class RuntimeConfig:
    """How experience is gathered (streams, actors) and where the learner runs."""

    num_envs: int = 32
    """Env streams per actor (one batched env per actor)."""
    batch_size: int = 32
    """Env streams per learner update; a multiple of num_envs (batch_size/num_envs segments)."""
    name: Annotated[Literal["serial", "parallel", "ray"], tyro.conf.arg(name="runtime")] = "serial"
    """serial: one deterministic process; parallel: actor processes + a learner on one
    machine; ray: Ray actors (this machine or a cluster) + a learner (the `ray` extra)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Device of the learner (agent, losses, optimiser); actors always act on the CPU."""
    ray_address: str | None = None
    """Ray runtime: None starts a local Ray with num_actors CPUs (shut down at the end);
    `auto` joins the cluster this machine belongs to (`ray start`), HOST:PORT the cluster
    whose head listens there."""
    num_threads: int = 1
    """torch threads of the learning process (0: torch's default). Small models run fastest on 1."""
    unroll_length: int = 16
    """Segment length M: steps per segment, TD horizon, update period, TBPTT span."""
    num_actors: int = 0
    """Actor processes of the parallel and ray runtimes (0: max(2, cpus - 1))."""
    decorrelate_steps: int = 0
    """Actors' envs: end each stream's first episode after a random 1..K steps (truncated,
    so bootstrapped), so that episodes of one fixed length (RepeatPrevious, CountRecall) do
    not keep every stream in step for the whole run; 0: off. Evaluation never cuts."""
    sensitivity_carry: Literal["auto", "actor", "learner"] = "auto"
    """Where the RTRL sensitivities are carried from one segment of a stream to the next:
    `actor` (the reference's way: every segment ships its start state with them), `learner`
    (parallel, ray: actors act with the light state and ship segments ~25x smaller; the
    learner carries each stream's sensitivities itself, with its own weights;
    r2ac/rl/runtimes/learner_carry.py). auto: learner under the ray runtime, actor otherwise."""
    actor_timeout_s: float = 300.0
    """The learner stops the run (with a checkpoint and a line naming the actors) when no
    segment arrives from any actor for this many seconds (parallel, ray)."""
    max_actor_restarts: int = 3
    """Actor processes that die (parallel, ray) are restarted this many times in all; past
    that the run stops with a checkpoint and a line naming the actor."""


@dataclass(frozen=True)
class RunConfig:
    """The run: its length, seed, directory, logs, checkpoints and evaluation."""

    total_frames: int = 10_000_000
    """Frames (agent steps summed over streams) to train for."""
    seed: int = 0
    """One seed for torch, numpy, python random, the envs and the action sampling."""
    out_dir: str | None = None
    """Run directory (default runs/<time>-<env>-<core>); must be new or empty."""
    checkpoint_every: int = 200
    """Write checkpoints/latest.pt every this many updates (and at the end)."""
    log_every: int = 10
    """Write a metrics row every this many updates."""
    eval_sets: int = 3
    """Evaluation: number of seeded sets of episodes (K)."""
    eval_episodes: int = 100
    """Evaluation: episodes per set (E)."""
    progress: bool = True
    """Show a progress bar (frames, frames/s, recent return, time left) on a terminal; when
    stderr is not a terminal, one such line every progress_every_s seconds."""
    progress_every_s: float = 30.0
    """Seconds between progress lines when stderr is not a terminal (a job, a log file)."""
    eval_greedy: bool = True
    """Evaluation: greedy (argmax) actions; --no-eval-greedy samples from the policy."""
    eval_at_end: bool = True
    """Run the evaluation at the end of training and write eval.json."""


@dataclass(frozen=True)
class StreamConfig:
    """The streaming agents (`r2ac train stream-ac | stream-q`; r2ac/rl/stream/,
    docs/rules/stream.md): K independent agents in lockstep, each on its own env stream, an
    update every step (batch 1, no replay) with eligibility traces; --learning-rate is ObGD's
    alpha or the factor of intentional updates' etas (stream-ac), or Q's SGD step (stream-q)."""

    num_agents: int = 1
    """K agents advanced as one batched computation, sharing nothing; agent k uses seed + k.
    --total-frames counts each agent's steps."""
    trace_lambda: float = 0.8
    """Eligibility-trace lambda (of actor and critic; of Q and h)."""
    kappa_actor: float = 3.0
    """stream-ac: ObGD's kappa of the actor."""
    kappa_critic: float = 2.0
    """stream-ac: ObGD's kappa of the critic."""
    stream_optimizer: Literal["obgd", "intentional"] = "obgd"
    """stream-ac: the update rule: obgd (Elsayed et al. 2024's bound on the step, --kappa-*) or
    intentional (Sharifnassab et al. 2026's step solved for an intended change, --eta-*;
    docs/rules/intentional.md); --learning-rate multiplies either's step. stream-q: left at
    obgd, QRC(lambda) with its SGD steps; intentional, Q(lambda) with intentional updates and
    Watkins's cut (--eta-q; no h network)."""
    eta_actor: float = 0.05
    """stream-ac --stream-optimizer intentional: the actor's intended step (local KL scale)."""
    eta_critic: float = 0.5
    """stream-ac --stream-optimizer intentional: the fraction of the TD error the critic's
    update intends to remove."""
    eta_q: float = 0.5
    """stream-q --stream-optimizer intentional: the fraction of the TD error Q's update
    intends to remove."""
    stream_mlp: tuple[int, ...] = (128, 128)
    """Widths of the layers (LayerNorm, leaky ReLU) below each network's core (their gradient
    is this step's only; `--stream-mlp` with no width: the core reads the observation)."""
    stream_top_mlp: tuple[int, ...] = ()
    """Widths of the layers (LayerNorm, leaky ReLU) between each network's core and its head
    (not recurrent: their gradient is exact)."""
    epsilon_start: float = 1.0
    """stream-q: epsilon-greedy's epsilon at the first step."""
    epsilon_end: float = 0.01
    """stream-q: epsilon after its linear decay."""
    epsilon_fraction: float = 0.1
    """stream-q: the fraction of --total-frames over which epsilon decays linearly."""
    h_learning_rate: float = 1e-5
    """stream-q: SGD step of QRC's secondary estimate h."""
    qrc_beta: float = 1.0
    """stream-q: QRC's regulariser of h (beta theta_h in h's update)."""
    compile_step: bool = False
    """stream-ac, stream-q: run each step as one compiled function (torch.compile,
    inductor's C++ on the CPU; r2ac/rl/stream/compiled.py, compiled_qrc.py): Discrete actions
    and the RTU / LRU cores; its compile time is printed. A built-in env runs inside it, up to
    64 steps a call (compiled_loop.py). Off: the eager step, the reference."""


@dataclass(frozen=True)
class TrainConfig:
    """A training run (R2AC: IMPALA or PPO with a chosen recurrent core; or the streaming
    agents), one group per concern; `loss.algorithm` says which.

    The defaults are task-neutral (IMPALA's, the paper's Table 3, at laptop sizes); what a
    task needs lives in its preset (r2ac.rl.presets).
    """

    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    run: RunConfig = field(default_factory=RunConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)

    @property
    def streaming(self) -> bool:
        """Whether a streaming agent trains (an update every step of each agent)."""
        return self.loss.algorithm in STREAM_ALGORITHMS

    @property
    def frames_per_update(self) -> int:
        """Frames of one update: a batch of segments; a streaming step is each agent's one."""
        if self.streaming:
            return self.stream.num_agents
        return self.runtime.unroll_length * self.runtime.batch_size

    @property
    def updates_total(self) -> int:
        """Updates of the whole run (a streaming run: total_frames, each agent's steps)."""
        if self.streaming:
            return self.run.total_frames
        return math.ceil(self.run.total_frames / self.frames_per_update)

    @property
    def segments_per_batch(self) -> int:
        return self.runtime.batch_size // self.runtime.num_envs

    @property
    def actors(self) -> int:
        if self.runtime.num_actors > 0:
            return self.runtime.num_actors
        return max(2, (os.cpu_count() or 2) - 1)

    def env_kwargs(self) -> dict:
        return parse_options(list(self.env.options))

    @classmethod
    def make(cls, **flat: Any) -> TrainConfig:
        """The defaults with the given options, by their flat names (`hidden_size=128`)."""
        return cls().updated(**flat)

    def updated(self, **flat: Any) -> TrainConfig:
        """A copy with the given options changed, by their flat names."""
        unknown = sorted(set(flat) - set(FLAT_FIELDS))
        if unknown:
            raise ConfigError(f"unknown config fields {unknown}")
        changes: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            group, attr = FLAT_FIELDS[name]
            changes.setdefault(group, {})[attr] = value
        return dataclasses.replace(
            self, **{g: dataclasses.replace(getattr(self, g), **kw) for g, kw in changes.items()}
        )

    def flat(self) -> dict[str, Any]:
        """Every option by its flat name (the flag's name with underscores)."""
        return {name: getattr(getattr(self, g), a) for name, (g, a) in FLAT_FIELDS.items()}


GROUPS: dict[str, type] = {
    "env": EnvConfig,
    "model": ModelConfig,
    "loss": LossConfig,
    "optim": OptimConfig,
    "runtime": RuntimeConfig,
    "run": RunConfig,
    "stream": StreamConfig,
}
# Fields whose attribute is not their flat name (the group's name would repeat).
_RENAMED = {("env", "id"): "env", ("env", "options"): "env_options", ("runtime", "name"): "runtime"}
# flat option name -> (group, attribute)
FLAT_FIELDS: dict[str, tuple[str, str]] = {
    _RENAMED.get((g, f.name), f.name): (g, f.name)
    for g, cls in GROUPS.items()
    for f in dataclasses.fields(cls)
}


def field_types() -> dict[str, Any]:
    """flat option name -> its annotated type (Annotated stripped)."""
    hints = {g: typing.get_type_hints(cls) for g, cls in GROUPS.items()}
    return {name: hints[g][a] for name, (g, a) in FLAT_FIELDS.items()}


def core_choices() -> list[str]:
    from r2ac.rtrl.registry import core_names

    return core_names(include_memoryless=True)


_POSITIVE = (
    "hidden_size",
    "stem_features",
    "unroll_length",
    "num_envs",
    "batch_size",
    "total_frames",
    "checkpoint_every",
    "log_every",
    "eval_sets",
    "eval_episodes",
)


def _fits(value, annotation) -> bool:
    """Whether `value` has the type `annotation` (int, float, str, bool, X | None,
    tuple[X, ...], Literal[...]); bools are not numbers here."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is tuple:
        return isinstance(value, tuple) and all(_fits(v, args[0]) for v in value)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def check_types(cfg: TrainConfig) -> None:
    """ConfigError naming every field whose value has the wrong type (e.g. from config.json)."""
    hints, values = field_types(), cfg.flat()
    bad = [
        f"{name}={value!r} (expected "
        f"{getattr(hints[name], '__name__', str(hints[name]).replace('typing.', ''))})"
        for name, value in values.items()
        if not _fits(value, hints[name])
    ]
    if bad:
        raise ConfigError(f"config values of the wrong type: {'; '.join(bad)}")


_FINITE = (
    "learning_rate",
    "discount",
    "reward_scale",
    "reward_clip",
    "baseline_cost",
    "entropy_cost",
    "entropy_floor",
    "entropy_floor_cap",
    "grad_clip",
    "forget_bias",
    "popart_sigma_floor",
    "progress_every_s",
    "actor_timeout_s",
)
# Bounds of the final evaluation (sets x episodes): far above any protocol in use (3 x 100),
# far below an evaluation that would never end
MAX_EVAL_SETS = 1_000
MAX_EVAL_EPISODES = 100_000
# The longest segment: an actor answers a stop request between segments, so one segment must
# take seconds, not minutes (4,096 steps of 32 streams: about a second on a CPU core)
MAX_UNROLL_LENGTH = 4_096
# (option, whether its value is in range, the range in words)
_RANGES = (
    ("learning_rate", lambda v: v >= 0, ">= 0"),
    ("discount", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("grad_clip", lambda v: v > 0, "> 0"),
    ("reward_scale", lambda v: v > 0, "> 0"),
    ("reward_clip", lambda v: v >= 0, ">= 0 (0: no clipping)"),
    ("baseline_cost", lambda v: v >= 0, ">= 0"),
    ("entropy_cost", lambda v: v >= 0, ">= 0"),
    ("entropy_floor", lambda v: v >= 0, ">= 0 (0: none)"),
    ("entropy_floor_cap", lambda v: 0 <= v < 1, "in [0, 1) (0: no cap)"),
    ("seed", lambda v: 0 <= v < 2**63, ">= 0"),
    ("popart_sigma_floor", lambda v: v >= 0, ">= 0"),
    ("progress_every_s", lambda v: v > 0, "> 0"),
    ("actor_timeout_s", lambda v: v > 0, "> 0"),
    ("eval_sets", lambda v: v <= MAX_EVAL_SETS, f"at most {MAX_EVAL_SETS:,}"),
    ("unroll_length", lambda v: v <= MAX_UNROLL_LENGTH, f"at most {MAX_UNROLL_LENGTH:,}"),
    ("eval_episodes", lambda v: v <= MAX_EVAL_EPISODES, f"at most {MAX_EVAL_EPISODES:,}"),
)
_NON_NEGATIVE = (
    "decorrelate_steps",
    "num_actors",
    "num_threads",
    "lr_warmup_updates",
    "head_hidden",
    "max_actor_restarts",
)


def _out_of_range(values: dict[str, Any]) -> list[str]:
    """Floats that are not finite or not in their range, and a negative seed (written so
    that NaN fails every test)."""
    finite = {n: values[n] for n in _FINITE}
    bad = [
        f"{n}={v} (not finite)" for n, v in finite.items() if v is not None and not math.isfinite(v)
    ]
    bad += [
        f"{n}={values[n]} (must be {rule})"
        for n, ok, rule in _RANGES
        if math.isfinite(values[n]) and not ok(values[n])
    ]
    return bad


def _not_positive(values: dict[str, Any]) -> list[str]:
    bad = [f"{name}={values[name]}" for name in _POSITIVE if values[name] < 1]
    bad += [f"{n}={values[n]}" for n in _NON_NEGATIVE if values[n] < 0]
    for name in ("mlp_hidden", "conv_channels"):
        bad += [f"{name}={values[name]}"] if any(n < 1 for n in values[name]) else []
    return bad


def validate(cfg: TrainConfig) -> TrainConfig:
    """Raise ConfigError for bad types, sizes, ranges, names or combinations; return cfg."""
    check_types(cfg)
    values = cfg.flat()
    bad = _out_of_range(values)
    if bad:
        raise ConfigError(f"out of range: {', '.join(bad)}")
    bad = _not_positive(values)
    if bad:
        raise ConfigError(f"sizes must be positive: {', '.join(bad)}")
    if cfg.model.core not in core_choices():
        raise ConfigError(
            f"unknown core {cfg.model.core!r}; choose one of {', '.join(core_choices())}"
        )
    if cfg.model.image_stem not in IMAGE_STEMS:
        stems = ", ".join(IMAGE_STEMS)
        raise ConfigError(f"unknown image stem {cfg.model.image_stem!r}; choose one of {stems}")
    check_chrono_span(cfg)
    if cfg.run.out_dir is not None and not cfg.run.out_dir.strip():
        raise ConfigError("--out-dir is empty; give a folder (or leave it out: runs/<name>)")
    loss, rt = cfg.loss, cfg.runtime
    if loss.popart_sigma_floor and not loss.popart:
        raise ConfigError(
            "--popart-sigma-floor floors the sigma that divides the advantages: it needs --popart"
        )
    if rt.batch_size % rt.num_envs:
        raise ConfigError(
            f"batch_size ({rt.batch_size}) must be a multiple of num_envs ({rt.num_envs})"
        )
    if rt.name not in RUNTIMES:
        raise ConfigError(f"unknown runtime {rt.name!r}; choose one of {', '.join(RUNTIMES)}")
    check_runtime_available(rt.name)
    check_device(rt.device)
    check_ray_options(cfg)
    check_sensitivity_carry(cfg)
    if cfg.streaming:
        check_stream_config(cfg)
    else:
        check_batched_config(cfg)
        check_learner_options(cfg)
    cfg.env_kwargs()
    return cfg


def check_chrono_span(cfg: TrainConfig) -> None:
    """--chrono-span: 0 or >= 3, on a core with a forget gate, and not with --forget-bias."""
    span, model = cfg.model.chrono_span, cfg.model
    if not span:
        return
    if span < 3:
        raise ConfigError(f"--chrono-span must be 0 (off) or >= 3, got {span}")
    if model.core.split("-", 1)[0] not in ("elstm", "felstm"):
        raise ConfigError(f"--chrono-span sets forget-gate biases: an elstm or felstm core's, "
                          f"not {model.core}'s")  # fmt: skip
    if model.forget_bias is not None:
        raise ConfigError("--chrono-span and --forget-bias both set b_f: give one of them")


# PPO's options and their defaults (an IMPALA run must leave them there)
_PPO_OPTIONS = {"targets": "vtrace", "gae_lambda": 0.95, "clip_coef": 0.2, "value_clip": 0.0}
# IMPALA's scalings of the advantages and their "off" values (a PPO run must leave them there)
_IMPALA_ADVANTAGE_OPTIONS = {"popart_sigma_floor": 0.0}


def multi_pass(cfg: TrainConfig) -> bool:
    """Whether the learner makes several steps per batch (else IMPALA's single step)."""
    return cfg.loss.algorithm == "ppo" or cfg.optim.epochs * cfg.optim.minibatches > 1


def check_start_correction(cfg: TrainConfig) -> None:
    """--rtrl-start-correction needs a core that has it with a sensitivity rule and several
    steps per batch."""
    from r2ac.rtrl.registry import CORES

    spec = CORES.get(cfg.model.core)
    if spec is None or not (spec.cls.has_first_order_start and spec.rule in ("rtrl", "snap1")):
        raise ConfigError(f"--rtrl-start-correction moves the start state by the carried "
                          f"sensitivities: elstm-rtrl or elstm-snap1, not {cfg.model.core}")  # fmt: skip
    if not multi_pass(cfg):
        raise ConfigError("--rtrl-start-correction acts from a batch's second step on: it needs "
                          "--algorithm ppo or --epochs / --minibatches above 1")  # fmt: skip


def _check_stream_core(cfg: TrainConfig) -> None:
    """The core: one with a streaming version, and options it has."""
    from r2ac.rtrl.stacked import STACKED_CORES

    if cfg.model.core not in STACKED_CORES:
        raise ConfigError(
            f"--core {cfg.model.core}: no streaming version; choose one of "
            f"{', '.join(STACKED_CORES)}"
        )
    if cfg.model.forget_bias is not None and not cfg.model.core.startswith("elstm"):
        raise ConfigError(f"--forget-bias: core {cfg.model.core} has no forget gate")
    if cfg.model.core.startswith("rtu") and cfg.model.hidden_size % 2:
        raise ConfigError(f"--hidden-size {cfg.model.hidden_size}: the RTU's is 2 x units (even)")


# The options each algorithm reads, by flat name, beside the env's and the run's: its
# subcommand of `r2ac train` lists these; a config of that algorithm leaves every other option
# at its default (a value there would be silently unread).
RUN_OPTIONS = (
    "env", "env_options", "total_frames", "seed", "out_dir", "checkpoint_every", "log_every",
    "eval_sets", "eval_episodes", "eval_greedy", "eval_at_end", "progress", "progress_every_s",
    "num_threads",
)  # fmt: skip
_STREAM_MODEL = ("core", "hidden_size", "forget_bias", "prev_action", "stream_mlp",
                 "stream_top_mlp", "num_agents", "trace_lambda", "learning_rate", "discount")  # fmt: skip
STREAM_OPTIONS = {
    "stream-ac": (*_STREAM_MODEL, "kappa_actor", "kappa_critic", "entropy_cost", "compile_step",
                  "stream_optimizer", "eta_actor", "eta_critic"),
    "stream-q": (*_STREAM_MODEL, "h_learning_rate", "qrc_beta", "epsilon_start", "epsilon_end",
                 "epsilon_fraction", "compile_step", "stream_optimizer", "eta_q"),
}  # fmt: skip
STREAM_ALGORITHMS = tuple(STREAM_OPTIONS)
# The cores the compiled streaming step has (r2ac/rl/stream/compiled_math.py)
COMPILED_STEP_CORES = ("rtu-rtrl", "rtu-bptt", "lru-rtrl", "lru-bptt")
# set by the streaming algorithms themselves (the agents see the observation only)
_STREAM_FIXED = {"last_reward": False}


def algorithm_options(algorithm: str) -> tuple[str, ...]:
    """The flat options a config of `algorithm` reads (its subcommand's, with the run's)."""
    if algorithm in STREAM_OPTIONS:
        return (*RUN_OPTIONS, *STREAM_OPTIONS[algorithm])
    stream_only = {n for names in STREAM_OPTIONS.values() for n in names} - {
        "core", "hidden_size", "forget_bias", "prev_action", "learning_rate", "discount",
        "entropy_cost",
    }  # fmt: skip
    other = _PPO_OPTIONS if algorithm == "impala" else _IMPALA_ADVANTAGE_OPTIONS
    skip = stream_only | set(other) | {"algorithm"}
    return tuple(n for n in FLAT_FIELDS if n not in skip)


def _unread(cfg: TrainConfig, defaults: TrainConfig, also: set[str]) -> str:
    """The flags of the options `cfg` sets away from `defaults` that its algorithm does not
    read (besides those in `also`, checked elsewhere), comma-joined; '' if none."""
    used = set(algorithm_options(cfg.loss.algorithm)) | also | {"algorithm"}
    values, base = cfg.flat(), defaults.flat()
    unread = [n for n in FLAT_FIELDS if n not in used and values[n] != base[n]]
    return ", ".join(f"--{n.replace('_', '-')}" for n in unread)


def check_stream_config(cfg: TrainConfig) -> None:
    """One-line ConfigErrors for the streaming agents' settings (called by validate)."""
    flags = _unread(cfg, TrainConfig().updated(**_STREAM_FIXED), set())
    if flags:
        raise ConfigError(
            f"{flags}: not options of {cfg.loss.algorithm} (its agents would not read them)"
        )
    k = cfg.stream.num_agents
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"--num-agents must be a positive integer, got {k!r}")
    if cfg.stream.compile_step and cfg.model.core not in COMPILED_STEP_CORES:
        raise ConfigError(
            f"--compile-step: the compiled step has the {', '.join(COMPILED_STEP_CORES)} cores, not "
            f"{cfg.model.core} (give --no-compile-step)"
        )
    _check_stream_core(cfg)
    _check_numbers(cfg)
    if cfg.loss.algorithm == "stream-ac":
        _check_ac_optimizer(cfg)
    else:
        _check_q_optimizer(cfg)


def _check_ac_optimizer(cfg: TrainConfig) -> None:
    """The other rule's settings at their defaults; intentional's etas > 0, gamma lambda < 1,
    the eager step."""
    s, base = cfg.stream, StreamConfig()
    other = ("eta_actor", "eta_critic") if s.stream_optimizer == "obgd" else (
        "kappa_actor", "kappa_critic")  # fmt: skip
    unread = [f"--{n.replace('_', '-')}" for n in other if getattr(s, n) != getattr(base, n)]
    if unread:
        raise ConfigError(f"{', '.join(unread)}: not read by --stream-optimizer "
                          f"{s.stream_optimizer}")  # fmt: skip
    if s.stream_optimizer != "intentional":
        return
    bad = [f"{n}={v}" for n, v in (("eta_actor", s.eta_actor), ("eta_critic", s.eta_critic))
           if not (math.isfinite(v) and v > 0)]  # fmt: skip
    if bad:
        raise ConfigError(f"out of range: {', '.join(bad)} (etas finite and > 0)")
    if not cfg.loss.discount * s.trace_lambda < 1:
        raise ConfigError("--stream-optimizer intentional needs discount x trace_lambda < 1")
    if s.compile_step:
        raise ConfigError("--compile-step: the compiled step has ObGD only "
                          "(give --no-compile-step with --stream-optimizer intentional)")  # fmt: skip


def _check_q_optimizer(cfg: TrainConfig) -> None:
    """QRC's settings (h's step, beta) unread by intentional Q(lambda), --eta-q by QRC; eta_q
    > 0, gamma lambda < 1, the eager step."""
    s, base = cfg.stream, StreamConfig()
    other = ("eta_q",) if s.stream_optimizer == "obgd" else ("h_learning_rate", "qrc_beta")
    unread = [f"--{n.replace('_', '-')}" for n in other if getattr(s, n) != getattr(base, n)]
    if unread:
        rule = "QRC(lambda) (--stream-optimizer obgd)" if s.stream_optimizer == "obgd" else (
            "--stream-optimizer intentional (Q(lambda), no h network)")  # fmt: skip
        raise ConfigError(f"{', '.join(unread)}: not read by stream-q's {rule}")
    if s.stream_optimizer != "intentional":
        return
    if not (math.isfinite(s.eta_q) and s.eta_q > 0):
        raise ConfigError(f"out of range: eta_q={s.eta_q} (finite and > 0)")
    if not cfg.loss.discount * s.trace_lambda < 1:
        raise ConfigError("--stream-optimizer intentional needs discount x trace_lambda < 1")
    if s.compile_step:
        raise ConfigError("--compile-step: the compiled step has ObGD only "
                          "(give --no-compile-step with --stream-optimizer intentional)")  # fmt: skip


def check_batched_config(cfg: TrainConfig) -> None:
    """A batched config leaves the streaming agents' own options at their defaults (IMPALA's
    and PPO's own are checked by check_learner_options)."""
    flags = _unread(cfg, TrainConfig(), {*_PPO_OPTIONS, *_IMPALA_ADVANTAGE_OPTIONS})
    if flags:
        raise ConfigError(
            f"{flags}: options of the streaming agents (r2ac train stream-ac | stream-q), "
            f"not of {cfg.loss.algorithm}"
        )


def _check_numbers(cfg: TrainConfig) -> None:
    s = cfg.stream
    bad = [f"trace_lambda={s.trace_lambda}"] if not 0 <= s.trace_lambda <= 1 else []
    bad += [f"{n}={v}" for n, v in (("kappa_actor", s.kappa_actor),
                                    ("kappa_critic", s.kappa_critic))
            if not (math.isfinite(v) and v > 0)]  # fmt: skip
    bad += [f"{n}={v}" for n, v in (("stream_mlp", s.stream_mlp),
                                    ("stream_top_mlp", s.stream_top_mlp)) if any(w < 1 for w in v)]  # fmt: skip
    if bad:
        raise ConfigError(
            f"out of range: {', '.join(bad)} (trace_lambda in [0, 1], kappas finite and > 0, "
            "widths >= 1)"
        )
    if cfg.loss.algorithm == "stream-q":
        _check_q_numbers(s)


def _check_q_numbers(s: StreamConfig) -> None:
    """One-line ConfigError for QRC's settings out of range."""
    bad = [f"{n}={v}" for n, v in (("epsilon_start", s.epsilon_start),
                                   ("epsilon_end", s.epsilon_end),
                                   ("epsilon_fraction", s.epsilon_fraction)) if not 0 <= v <= 1]  # fmt: skip
    bad += [f"{n}={v}" for n, v in (("h_learning_rate", s.h_learning_rate),
                                    ("qrc_beta", s.qrc_beta))
            if not (math.isfinite(v) and v >= 0)]  # fmt: skip
    if bad:
        raise ConfigError(
            f"out of range: {', '.join(bad)} (epsilons and epsilon_fraction in [0, 1], "
            "h_learning_rate and qrc_beta finite and >= 0)"
        )


def check_learner_options(cfg: TrainConfig) -> None:
    """One-line ConfigErrors for the learner's passes and objective."""
    optim, loss = cfg.optim, cfg.loss
    if optim.epochs < 1 or optim.minibatches < 1:
        raise ConfigError(
            f"--epochs ({optim.epochs}) and --minibatches ({optim.minibatches}) must be >= 1"
        )
    if cfg.runtime.batch_size % optim.minibatches:
        raise ConfigError(
            f"batch_size ({cfg.runtime.batch_size}) must divide into --minibatches "
            f"({optim.minibatches})"
        )
    if optim.rtrl_start_correction:
        check_start_correction(cfg)
    numbers = {"adam_eps": optim.adam_eps, "gae_lambda": loss.gae_lambda}
    numbers.update(clip_coef=loss.clip_coef, value_clip=loss.value_clip)
    bad = [f"{k}={v}" for k, v in numbers.items() if not math.isfinite(v) or v < 0]
    bad += [f"adam_eps={optim.adam_eps}"] if optim.adam_eps == 0 else []
    bad += [f"gae_lambda={loss.gae_lambda}"] if loss.gae_lambda > 1 else []
    if bad:
        raise ConfigError(f"out of range: {', '.join(bad)} (adam_eps > 0, gae_lambda in [0, 1])")
    if loss.algorithm == "ppo":
        given = [k for k, v in _IMPALA_ADVANTAGE_OPTIONS.items() if getattr(loss, k) != v]
        if given:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise ConfigError(f"{flags}: IMPALA's options; PPO standardises its advantages per "
                              f"minibatch, so they would be unread")  # fmt: skip
    if loss.algorithm == "impala":
        given = [k for k, v in _PPO_OPTIONS.items() if getattr(loss, k) != v]
        if given:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            reset = " ".join(f"--{k.replace('_', '-')} {_PPO_OPTIONS[k]}" for k in given)
            raise ConfigError(f"{flags}: PPO options; they need --algorithm ppo (or: {reset})")


# The batched runtimes by name: module and class (r2ac/rl/runtimes/base.py is their base).
RUNTIMES = {
    "serial": ("r2ac.rl.runtimes.serial", "SerialRuntime"),
    "parallel": ("r2ac.rl.runtimes.parallel", "ParallelRuntime"),
    "ray": ("r2ac.rl.runtimes.ray", "RayRuntime"),
}
# The streaming agents' trainer (r2ac/rl/stream/runtime.py), for every streaming algorithm.
STREAM_TRAINER = ("r2ac.rl.stream.runtime", "StreamRuntime")
# Image stems by name (r2ac/rl/model/nets.py builds them)
IMAGE_STEMS = ("resnet", "shallow")


def trainer_path(cfg: TrainConfig) -> tuple[str, str]:
    """The (module, class) of the trainer that runs `cfg`."""
    return STREAM_TRAINER if cfg.streaming else RUNTIMES[cfg.runtime.name]


def check_runtime_available(name: str) -> None:
    """ConfigError when the runtime needs an extra that is not installed (ray)."""
    import importlib.util

    if name == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "--runtime ray needs Ray: install the ray extra (pip install -e '.[ray]')"
        )
    if importlib.util.find_spec(RUNTIMES[name][0]) is None:
        raise ConfigError(f"--runtime {name} is not part of this version of r2ac")


def check_device(device: str) -> None:
    """ConfigError for `cuda` on a machine where torch sees no CUDA device."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {device!r}; choose cpu or cuda")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device here; use --device cpu")


_RAY_ADDRESS = re.compile(r"^(auto|[A-Za-z0-9.\-]+:[0-9]{1,5})$")


def check_sensitivity_carry(cfg: TrainConfig) -> None:
    """--sensitivity-carry learner not with the serial runtime."""
    if cfg.runtime.sensitivity_carry == "learner" and cfg.runtime.name == "serial":
        raise ConfigError(
            "--sensitivity-carry learner needs --runtime parallel or ray (the serial runtime "
            "keeps the actors' carry, for its bit-exact resume)"
        )


def check_ray_options(cfg: TrainConfig) -> None:
    """--ray-address only with the ray runtime, and well formed."""
    address = cfg.runtime.ray_address
    if address is None:
        return
    if cfg.runtime.name != "ray":
        raise ConfigError("--ray-address needs --runtime ray")
    if not _RAY_ADDRESS.match(address):
        raise ConfigError(
            f"--ray-address {address!r}: give `auto` or HOST:PORT (the head's GCS "
            "address, as `ray start --head` prints it)"
        )


def learner_carries(cfg: TrainConfig) -> bool:
    """Whether the learner carries the sensitivities (`sensitivity_carry`, auto resolved)."""
    if cfg.runtime.sensitivity_carry == "auto":
        return cfg.runtime.name == "ray"
    return cfg.runtime.sensitivity_carry == "learner"


def to_dict(cfg: TrainConfig) -> dict:
    """The config as config.json holds it: one object per group."""
    return dataclasses.asdict(cfg)


def flatten(data: dict) -> dict:
    """A config dict by flat option names, whether grouped (config.json now) or flat (runs
    written before the groups); entries of neither kind are kept as they are."""
    groups = (*GROUPS, *OLDER_GROUPS)
    if not (data and all(k in groups and isinstance(v, dict) for k, v in data.items())):
        return dict(data)
    reverse = {ga: name for name, ga in FLAT_FIELDS.items()}
    return {_flat_name(reverse, g, k): v for g, group in data.items() for k, v in group.items()}


def _flat_name(reverse: dict, group: str, attr: str) -> str:
    """The flat name of `group.attr`; a field since moved to another group (or removed)
    keeps its own name."""
    if (group, attr) in reverse:
        return reverse[(group, attr)]
    known = attr in FLAT_FIELDS or attr in REMOVED_OPTIONS or attr in OLDER_FIELDS
    return attr if known else f"{group}.{attr}"


# Groups of older configs whose fields now live in other groups (under the same flat names)
OLDER_GROUPS = ("study",)
# Runtime names of older configs that are now algorithms (`streaming` said which)
OLDER_RUNTIMES = ("stream",)
# Fields of older configs that upgrade_older turns into today's
OLDER_FIELDS = ("streaming",)


def upgrade_older(flat: dict) -> dict:
    """An older streaming config (`streaming` ac / q on `runtime` stream, with unroll length,
    batch size and envs per actor forced to 1) as its algorithm now names it; options its
    agents did not read go back to their defaults (they were unread: the run is the same)."""
    flat = dict(flat)
    streaming = flat.pop("streaming", "off")
    if flat.get("runtime") in OLDER_RUNTIMES:
        del flat["runtime"]
    if streaming not in ("ac", "q"):
        return flat
    flat["algorithm"] = f"stream-{streaming}"
    used = set(algorithm_options(flat["algorithm"])) | {"algorithm", "last_reward"}
    return {k: v for k, v in flat.items() if k in used}


# Options this version no longer has, at the values every run that did not set them had: a
# config.json or checkpoint of an older run that left them there still loads.
REMOVED_OPTIONS: dict[str, Any] = {
    "value_detach": False,
    "entropy_detach": False,
    "critic_clock": False,
    "policy_init_scale": 1.0,
    "core_lr_scale": 1.0,
    "core_grad_clip": 0.0,
    "rtrl_history_epochs": 0,
    "entropy_floor_rate": 0.01,
    "popart_beta": 1e-3,
    "rms_alpha": 0.99,
    "rms_eps": 0.01,
    "popart_advantages": True,
    "advantage_norm": False,
}


def _drop_removed(flat: dict) -> dict:
    """`flat` without the removed options; ConfigError if one is set away from its old
    default (this version cannot run what that config asked for)."""
    changed = [f"{k}={flat[k]!r}" for k, v in REMOVED_OPTIONS.items() if k in flat and flat[k] != v]
    if changed:
        raise ConfigError(
            f"config sets options this version no longer has: {', '.join(changed)} "
            "(run it with the version in its config.json's git revision)"
        )
    return {k: v for k, v in flat.items() if k not in REMOVED_OPTIONS}


def from_dict(data: dict, require: tuple[str, ...] = ()) -> TrainConfig:
    """The config of a config.json or checkpoint (grouped, or flat from an older run);
    ConfigError if one of the flat options `require` is missing."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
    flat = _drop_removed(flatten(data))
    missing = [n for n in require if n not in flat]
    if missing:
        raise ConfigError(f"config lacks {', '.join(missing)} (emptied or damaged?)")
    flat = upgrade_older(flat)
    unknown = sorted(set(flat) - set(FLAT_FIELDS))
    if unknown:
        raise ConfigError(f"config has unknown fields {unknown}")
    types_ = field_types()
    tuples = {n for n, tp in types_.items() if "tuple" in str(tp)}
    kw = {k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in flat.items()}
    return TrainConfig.make(**kw)


__all__ = ["TrainConfig", "validate", "to_dict", "from_dict", "flatten"]
