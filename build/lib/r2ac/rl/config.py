"""Typed training configs, named presets and validation (the CLI is generated from them).

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
from dataclasses import dataclass
from typing import Literal

from r2ac.envs.registry import DEFAULT_ENV, parse_options
from r2ac.errors import ConfigError

FEEDFORWARD = "feedforward"


@dataclass(frozen=True)
class TrainConfig:
    """R2AC training run (IMPALA with a chosen recurrent core).

    The defaults are task-neutral (IMPALA's, SPEC.md Table 3, at laptop sizes); what a task
    needs lives in its preset in PRESETS, the one place where named configs are defined.
    """

    env: str = DEFAULT_ENV
    """Env name `<family>/<task>` (see `r2ac envs`)."""
    env_options: tuple[str, ...] = ()
    """Env options as key=value pairs, e.g. delay=64 (typed by the env's constructor)."""
    core: str = "elstm-rtrl"
    """Core name: `feedforward` or any `<core>-<rule>` of r2ac.rtrl (e.g. elstm-rtrl, elstm-bptt)."""
    hidden_size: int = 64
    """Core state size N."""
    forget_bias: float | None = None
    """Initial forget-gate bias b_f of eLSTM cores (None: the core's own default, 1)."""
    stem_features: int = 64
    """Output features of the stem (the core input is these plus the clipped last reward)."""
    mlp_hidden: tuple[int, ...] = (64,)
    """Hidden layer sizes of the MLP stem (vector observations)."""
    head_hidden: int = 0
    """Width of a ReLU layer between the core and the policy / value heads, shared by both
    (POPGym's baselines decode the memory's output with an MLP); 0: linear heads."""
    conv_channels: tuple[int, ...] = (16, 32, 32)
    """Channels of the three ResNet stages (image observations)."""
    image_stem: str = "resnet"
    """Stem for image observations: `resnet` (IMPALA's deep one, the paper's) or `shallow`
    (IMPALA's two-conv one, cheap enough for Atari on a CPU)."""
    load_stem: str | None = None
    """Weights-only agent checkpoint (e.g. RUN/checkpoints/agent.pt) to load the stem from."""
    freeze_stem: bool = False
    """Freeze the stem (no gradients): a pre-trained one, or a random one for the built-in tasks."""
    unroll_length: int = 16
    """Segment length M: steps per segment, TD horizon, update period, TBPTT span."""
    num_envs: int = 32
    """Env streams per actor (one batched env per actor)."""
    batch_size: int = 32
    """Env streams per learner update; a multiple of num_envs (batch_size/num_envs segments)."""
    total_frames: int = 10_000_000
    """Frames (agent steps summed over streams) to train for."""
    learning_rate: float = 6e-4
    """RMSProp learning rate."""
    lr_decay: bool = False
    """Decay the learning rate linearly to 0 over total_frames (--no-lr-decay: constant)."""
    lr_warmup_updates: int = 0
    """Ramp the learning rate linearly from 0 over this many updates (0: none)."""
    rms_alpha: float = 0.99
    """RMSProp smoothing constant."""
    rms_eps: float = 0.01
    """RMSProp epsilon."""
    discount: float = 0.99
    """Discount gamma."""
    reward_scale: float = 1.0
    """Multiply the clipped rewards by this, in the losses (the value targets scale with it)
    and in the core's last-reward input."""
    prev_action: bool = False
    """Feed the previous action (one-hot, zeros at an episode start) to the core with the last
    reward, as POPGym's baselines do."""
    popart: bool = False
    """PopArt value normalisation: the value head learns normalised returns and the losses
    divide value errors and advantages by the running std of the V-trace targets, so that
    tasks with tiny rewards (POPGym: +-1/51 per step) train like tasks with unit rewards."""
    popart_beta: float = 1e-3
    """Step size of PopArt's running target mean and second moment (one move per update)."""
    popart_advantages: bool = True
    """With popart: divide the policy-gradient advantages by sigma too (PopArt's form);
    --no-popart-advantages normalises only the value loss (the critic)."""
    popart_sigma_floor: float = 0.0
    """With popart and popart_advantages: divide the advantages by max(sigma, this) (the
    critic still by sigma). 0: by sigma, PopArt's form. A floor stops the policy gradient
    from growing as 1/sigma when an accurate critic sees a small spread of returns
    (docs/rl.md, "Diagnosing a run")."""
    advantage_norm: bool = False
    """Standardise the policy-gradient advantages over each batch (mean 0, std 1), PPO-style:
    the policy's step no longer depends on the reward scale."""
    baseline_cost: float = 0.5
    """Weight of the baseline loss."""
    entropy_cost: float = 0.01
    """Weight of the entropy regulariser."""
    grad_clip: float = 40.0
    """Global gradient-norm clipping threshold."""
    seed: int = 0
    """One seed for torch, numpy, python random, the envs and the action sampling."""
    runtime: Literal["serial", "parallel", "ray"] = "serial"
    """serial: one deterministic process; parallel: actor processes + a learner on one
    machine; ray: Ray actors (this machine or a cluster) + a learner (the `ray` extra)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Device of the learner (agent, losses, optimiser); actors always act on the CPU."""
    num_actors: int = 0
    """Actor processes of the parallel and ray runtimes (0: max(2, cpus - 1))."""
    max_actor_restarts: int = 3
    """Actor processes that die (parallel, ray) are restarted this many times in all; past
    that the run stops with a checkpoint and a line naming the actor."""
    ray_address: str | None = None
    """Ray runtime: None starts a local Ray with num_actors CPUs (shut down at the end);
    `auto` joins the cluster this machine belongs to (`ray start`), HOST:PORT the cluster
    whose head listens there."""
    sensitivity_carry: Literal["auto", "actor", "learner"] = "auto"
    """Where the RTRL sensitivities are carried from one segment of a stream to the next:
    `actor` (the reference's way: every segment ships its start state with them), `learner`
    (parallel, ray: actors act with the light state and ship segments ~25x smaller; the
    learner carries each stream's sensitivities itself, with its own weights;
    r2ac/rl/learner_carry.py). auto: learner under the ray runtime, actor otherwise."""
    actor_timeout_s: float = 300.0
    """The learner stops the run (with a checkpoint and a line naming the actors) when no
    segment arrives from any actor for this many seconds (parallel, ray)."""
    num_threads: int = 1
    """torch threads of the learner process (0: torch's default). Small models run fastest on 1."""
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
    eval_greedy: bool = True
    """Evaluation: greedy (argmax) actions; --no-eval-greedy samples from the policy."""
    eval_at_end: bool = True
    """Run the evaluation at the end of training and write eval.json."""
    progress: bool = True
    """Show a progress bar (frames, frames/s, recent return, time left) on a terminal; when
    stderr is not a terminal, one such line every progress_every_s seconds."""
    progress_every_s: float = 30.0
    """Seconds between progress lines when stderr is not a terminal (a job, a log file)."""

    @property
    def updates_total(self) -> int:
        return math.ceil(self.total_frames / (self.unroll_length * self.batch_size))

    @property
    def segments_per_batch(self) -> int:
        return self.batch_size // self.num_envs

    @property
    def actors(self) -> int:
        if self.num_actors > 0:
            return self.num_actors
        return max(2, (os.cpu_count() or 2) - 1)

    def env_kwargs(self) -> dict:
        return parse_options(list(self.env_options))


def _paper(**kw) -> TrainConfig:
    """SPEC.md Table 3/4 values shared by the paper's domains."""
    base = dict(
        forget_bias=None,
        stem_features=256,
        learning_rate=6e-4,
        batch_size=32,
        num_envs=8,
        discount=0.99,
        baseline_cost=0.5,
        entropy_cost=0.01,
        grad_clip=40.0,
        runtime="parallel",
        lr_decay=False,
        num_threads=0,
        freeze_stem=False,
        checkpoint_every=1000,
        log_every=20,
    )
    base.update(kw)
    return TrainConfig(**base)


PRESETS: dict[str, TrainConfig] = {
    # The built-in delayed cue (docs/rl.md, "Presets"): a frozen random stem, a forget bias
    # that keeps the cue for the 65-step episode (f = 0.989, f^64 = 0.5), lr 5e-3 decayed.
    "delayed-cue": TrainConfig(
        env="builtin/delayed-cue",
        env_options=("delay=64",),
        forget_bias=4.5,
        freeze_stem=True,
        learning_rate=5e-3,
        lr_decay=True,
        entropy_cost=0.003,
    ),
    "watermaze": TrainConfig(
        env="builtin/watermaze",
        env_options=(),
        hidden_size=128,
        stem_features=64,
        unroll_length=20,
        total_frames=5_000_000,
        learning_rate=2e-3,
        forget_bias=3.0,
        entropy_cost=0.01,
        freeze_stem=True,
        lr_decay=True,
    ),
    # POPGym (Morad et al. 2023): card games and CartPoles with returns in [-1, 1] and
    # per-step rewards of 1/51 .. 1/200. Measured on RepeatFirstEasy and RepeatPreviousEasy
    # (docs/results.md, "POPGym"): the actor needs rewards of about +-1 per step (x50) to
    # learn at all; the critic then needs PopArt's normalisation, or its error spikes
    # (baseline loss up to 1e5) wreck the shared core; dividing the advantages by PopArt's
    # sigma too keeps the policy's entropy up (with the critic alone normalised the policy
    # collapsed on RepeatPrevious within 50 k frames); a shared 128-wide ReLU layer before
    # the heads (as POPGym's baselines decode memory); the previous action marks an
    # episode's first step and disambiguates observations; the warm-up tames RMSProp's
    # first, 10x-too-large steps; the linear decay keeps a learned policy; a trainable stem.
    # The sigma floor: RTRL's critic learns the episode clock, so its PopArt sigma stays at
    # 2-8 (TBPTT's 13-22) and the advantages get 3-7x TBPTT's weight; RepeatPrevious then
    # stalled in 1 of 3 seeds. Dividing the advantages by max(sigma, 15) solved 3 of 3.
    "popgym": TrainConfig(
        env="gym/popgym-RepeatFirstEasy-v0",
        env_options=(),
        hidden_size=128,
        forget_bias=None,
        freeze_stem=False,
        unroll_length=4,
        total_frames=1_000_000,
        learning_rate=2e-3,
        lr_decay=True,
        lr_warmup_updates=200,
        entropy_cost=0.01,
        reward_scale=50.0,
        prev_action=True,
        popart=True,
        popart_advantages=True,
        popart_sigma_floor=15.0,
        head_hidden=128,
        eval_sets=3,
        eval_episodes=100,
    ),
    "dmlab": _paper(
        env="dmlab/rooms_watermaze",
        env_options=(),
        hidden_size=512,
        unroll_length=100,
        total_frames=30_000_000,
        eval_sets=3,
        eval_episodes=100,
    ),
    "atari": _paper(
        env="atari/Breakout",
        env_options=(),
        hidden_size=256,
        unroll_length=50,
        total_frames=200_000_000,
        eval_sets=5,
        eval_episodes=30,
    ),
    "procgen": _paper(
        env="procgen/chaser",
        env_options=(),
        hidden_size=256,
        unroll_length=50,
        total_frames=200_000_000,
        eval_sets=3,
        eval_episodes=100,
    ),
}


def preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_overrides(name: str) -> dict:
    """The fields in which preset `name` differs from TrainConfig's defaults."""
    base, chosen = to_dict(TrainConfig()), to_dict(preset(name))
    return {k: v for k, v in chosen.items() if v != base[k]}


def preset_table() -> str:
    """Markdown table of every preset's values that differ from the defaults (docs/rl.md
    shows it verbatim; a test keeps the two equal)."""
    lines = ["| preset | values (beyond TrainConfig's defaults) |", "|---|---|"]
    for name in PRESETS:
        values = ", ".join(f"`{k}={v}`" for k, v in preset_overrides(name).items())
        lines.append(f"| {name} | {values or '(the defaults)'} |")
    return "\n".join(lines)


def preset_help(width: int = 100) -> str:
    """The presets as `r2ac train --help` lists them: each name and its values beyond
    TrainConfig's defaults (the same values as preset_table), wrapped to `width`."""
    import textwrap

    pad = max(len(name) for name in PRESETS) + 4
    lines = ["Presets (--preset NAME; its values beyond TrainConfig's defaults, then flags):"]
    for name in PRESETS:
        values = ", ".join(f"{k}={v}" for k, v in preset_overrides(name).items())
        lines += textwrap.wrap(
            values or "(the defaults)",
            width,
            initial_indent=f"  {name:<{pad - 2}}",
            subsequent_indent=" " * pad,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def core_choices() -> list[str]:
    from r2ac.rtrl.registry import core_names

    return [FEEDFORWARD, *core_names()]


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
    hints = typing.get_type_hints(TrainConfig)
    bad = [
        f"{f.name}={getattr(cfg, f.name)!r} (expected "
        f"{getattr(hints[f.name], '__name__', str(hints[f.name]).replace('typing.', ''))})"
        for f in dataclasses.fields(TrainConfig)
        if not _fits(getattr(cfg, f.name), hints[f.name])
    ]
    if bad:
        raise ConfigError(f"config values of the wrong type: {'; '.join(bad)}")


def _out_of_range(cfg: TrainConfig) -> list[str]:
    """Floats that are not finite or not in their range, and a negative seed (written so
    that NaN fails every test)."""
    finite = {
        n: getattr(cfg, n)
        for n in (
            "learning_rate",
            "rms_alpha",
            "rms_eps",
            "discount",
            "reward_scale",
            "baseline_cost",
            "entropy_cost",
            "grad_clip",
            "forget_bias",
            "popart_beta",
            "popart_sigma_floor",
            "progress_every_s",
            "actor_timeout_s",
        )
    }
    bad = [
        f"{n}={v} (not finite)" for n, v in finite.items() if v is not None and not math.isfinite(v)
    ]
    rules = (
        ("learning_rate", cfg.learning_rate >= 0, ">= 0"),
        ("rms_eps", cfg.rms_eps > 0, "> 0"),
        ("rms_alpha", 0 <= cfg.rms_alpha < 1, "in [0, 1)"),
        ("discount", 0 <= cfg.discount <= 1, "in [0, 1]"),
        ("grad_clip", cfg.grad_clip > 0, "> 0"),
        ("reward_scale", cfg.reward_scale > 0, "> 0"),
        ("baseline_cost", cfg.baseline_cost >= 0, ">= 0"),
        ("entropy_cost", cfg.entropy_cost >= 0, ">= 0"),
        ("seed", 0 <= cfg.seed < 2**63, ">= 0"),
        ("popart_beta", 0 < cfg.popart_beta <= 1, "in (0, 1]"),
        ("popart_sigma_floor", cfg.popart_sigma_floor >= 0, ">= 0"),
        ("progress_every_s", cfg.progress_every_s > 0, "> 0"),
        ("actor_timeout_s", cfg.actor_timeout_s > 0, "> 0"),
    )
    bad += [
        f"{n}={getattr(cfg, n)} (must be {rule})"
        for n, ok, rule in rules
        if not ok and math.isfinite(getattr(cfg, n))
    ]
    return bad


def validate(cfg: TrainConfig) -> TrainConfig:
    """Raise ConfigError for bad types, sizes, ranges, names or combinations; return cfg."""
    check_types(cfg)
    bad = _out_of_range(cfg)
    if bad:
        raise ConfigError(f"out of range: {', '.join(bad)}")
    bad = [f"{name}={getattr(cfg, name)}" for name in _POSITIVE if getattr(cfg, name) < 1]
    bad += [
        f"{n}={getattr(cfg, n)}"
        for n in (
            "num_actors",
            "num_threads",
            "lr_warmup_updates",
            "head_hidden",
            "max_actor_restarts",
        )
        if getattr(cfg, n) < 0
    ]
    bad += [f"mlp_hidden={cfg.mlp_hidden}"] if any(n < 1 for n in cfg.mlp_hidden) else []
    bad += [f"conv_channels={cfg.conv_channels}"] if any(n < 1 for n in cfg.conv_channels) else []
    if bad:
        raise ConfigError(f"sizes must be positive: {', '.join(bad)}")
    if cfg.core not in core_choices():
        raise ConfigError(f"unknown core {cfg.core!r}; choose one of {', '.join(core_choices())}")
    from r2ac.rl.nets import check_image_stem

    check_image_stem(cfg.image_stem)
    if cfg.popart_sigma_floor and not (cfg.popart and cfg.popart_advantages):
        raise ConfigError(
            "--popart-sigma-floor floors the sigma that divides the advantages: it needs "
            "--popart with --popart-advantages"
        )
    if cfg.batch_size % cfg.num_envs:
        raise ConfigError(
            f"batch_size ({cfg.batch_size}) must be a multiple of num_envs ({cfg.num_envs})"
        )
    if cfg.runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {cfg.runtime!r}; choose one of {', '.join(RUNTIMES)}")
    check_runtime_available(cfg.runtime)
    check_device(cfg.device)
    check_ray_options(cfg)
    check_sensitivity_carry(cfg)
    cfg.env_kwargs()
    return cfg


# The runtimes by name: module and class (r2ac/rl/runtime.py is their base).
RUNTIMES = {
    "serial": ("r2ac.rl.runtime_serial", "SerialRuntime"),
    "parallel": ("r2ac.rl.runtime_parallel", "ParallelRuntime"),
    "ray": ("r2ac.rl.runtime_ray", "RayRuntime"),
}


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
    if cfg.sensitivity_carry == "learner" and cfg.runtime == "serial":
        raise ConfigError(
            "--sensitivity-carry learner needs --runtime parallel or ray (the serial runtime "
            "keeps the actors' carry, for its bit-exact resume)"
        )


def check_ray_options(cfg: TrainConfig) -> None:
    """--ray-address only with the ray runtime, and well formed."""
    if cfg.ray_address is None:
        return
    if cfg.runtime != "ray":
        raise ConfigError("--ray-address needs --runtime ray")
    if not _RAY_ADDRESS.match(cfg.ray_address):
        raise ConfigError(
            f"--ray-address {cfg.ray_address!r}: give `auto` or HOST:PORT (the head's GCS "
            "address, as `ray start --head` prints it)"
        )


def learner_carries(cfg: TrainConfig) -> bool:
    """Whether the learner carries the sensitivities (`sensitivity_carry`, auto resolved)."""
    if cfg.sensitivity_carry == "auto":
        return cfg.runtime == "ray"
    return cfg.sensitivity_carry == "learner"


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(data: dict) -> TrainConfig:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"config has unknown fields {unknown}")
    tuples = {f.name for f in dataclasses.fields(TrainConfig) if "tuple" in str(f.type)}
    kw = {k: tuple(v) if k in tuples and v is not None else v for k, v in data.items()}
    return TrainConfig(**kw)


__all__ = ["TrainConfig", "PRESETS", "preset", "validate", "to_dict", "from_dict"]
