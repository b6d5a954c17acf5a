"""Named configs: `r2ac train --preset NAME` takes one as its defaults, flags override it.

Each preset gives only what its task needs beyond TrainConfig's task-neutral defaults, by
flat option names; `preset_table()` is shown verbatim in docs/rl.md (a test keeps the two
equal) and `preset_help()` in `r2ac train --help`.
"""

from __future__ import annotations

from typing import Any

from r2ac.errors import ConfigError
from r2ac.rl.config import TrainConfig


def _paper(**kw) -> TrainConfig:
    """The paper's Table 3/4 values shared by its domains (docs/design.md)."""
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
    return TrainConfig.make(**base)


POPGYM_IMPALA = TrainConfig.make(  # `popgym-impala`, and the base of `popgym` (below)
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
    popart_sigma_floor=15.0,
    head_hidden=128,
    eval_sets=3,
    eval_episodes=100,
)


# Continuous control (Box actions; Pendulum-v1 by default): PPO-clip with GAE(0.95) and
# Adam 3e-4 as cleanrl's and SB3's continuous PPO, 4 epochs x 4 minibatches, no entropy
# bonus (the Gaussian's log-std is a parameter). The rewards are not clipped
# (Pendulum's are -16.3 .. 0 a step) but scaled by 0.1, and gamma 0.95 (SB3's zoo uses
# 0.9 on Pendulum), so returns are O(1-10) without PopArt. 64 streams of 32 steps: 2,048
# frames a batch (SB3's n_steps x n_envs); a CPU runs it serially.
CONTROL = TrainConfig.make(
    env="gym/Pendulum-v1",
    env_options=(),
    hidden_size=64,
    forget_bias=None,
    unroll_length=32,
    num_envs=64,
    batch_size=64,
    total_frames=2_000_000,
    discount=0.95,
    reward_clip=0.0,
    reward_scale=0.1,
    algorithm="ppo",
    targets="gae",
    epochs=4,
    minibatches=4,
    optimizer="adam",
    learning_rate=3e-4,
    grad_clip=0.5,
    entropy_cost=0.0,
    eval_sets=3,
    eval_episodes=100,
)


# the `stream` preset (below), the base of `stream-intentional`
STREAM = TrainConfig.make(
    env="builtin/memory-chain",
    env_options=("length=32",),
    core="rtu-rtrl",
    hidden_size=64,
    algorithm="stream-ac",
    learning_rate=1.0,
    discount=0.99,
    entropy_cost=0.01,
    last_reward=False,
    prev_action=False,
    total_frames=300_000,
    checkpoint_every=50_000,
    log_every=1_000,
    num_threads=1,
)


# the `stream-q` preset (below), the base of `stream-intentional-q`
STREAM_Q = TrainConfig.make(
    env="builtin/memory-chain",
    env_options=("length=32",),
    core="rtu-rtrl",
    hidden_size=64,  # config/cell/rtu.yaml: 64 features
    algorithm="stream-q",
    stream_mlp=(128,),  # qrc_bsuite.py: one Dense(128, sparse 0.9) -> LayerNorm -> leaky ReLU
    learning_rate=1e-4,  # qrc.yaml q_lr: plain SGD on Q (no ObGD bound, no clip on MemoryChain)
    h_learning_rate=1e-5,  # qrc.yaml h_lr: plain SGD on h
    qrc_beta=1.0,  # qrc.yaml regularization_coefficient
    trace_lambda=0.95,  # hyperparameters/qrc/.../memory_chain.yaml
    discount=0.99,  # qrc.yaml gamma
    epsilon_start=1.0,  # qrc.yaml: 1.0 -> 0.01, linear over 10% of the steps
    epsilon_end=0.01,
    epsilon_fraction=0.1,
    last_reward=False,  # as `stream`: the bit must be carried by the core
    prev_action=False,
    total_frames=500_000,  # memory_chain.yaml total_timesteps
    checkpoint_every=50_000,
    log_every=1_000,
    num_threads=1,
)


PRESETS: dict[str, TrainConfig] = {
    # The built-in delayed cue (docs/rl.md, "Presets"): a frozen random stem, a forget bias
    # that keeps the cue for the 65-step episode (f = 0.989, f^64 = 0.5), lr 5e-3 decayed.
    "delayed-cue": TrainConfig.make(
        env="builtin/delayed-cue",
        env_options=("delay=64",),
        forget_bias=4.5,
        freeze_stem=True,
        learning_rate=5e-3,
        lr_decay=True,
        entropy_cost=0.003,
    ),
    "watermaze": TrainConfig.make(
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
    # per-step rewards of 1/51 .. 1/200. The peer's recipe (Sample Factory's APPO): PPO-clip
    # with GAE(0.95), Adam 1e-3 (eps 1e-6), 2 epochs x 4 minibatches of 64 whole streams
    # (256 streams, 1,024 frames a batch), advantages standardised per minibatch, global
    # clip 4, the lr decayed linearly (a learned policy stays learned), entropy cost 0.01.
    # Kept from popgym-impala: rewards x50 with PopArt on the critic, the previous action as
    # input, a shared 128-wide ReLU layer before the heads, a trainable stem. PPO clip 0.1:
    # the one value whose training return left the random level on CountRecallEasy.
    "popgym": POPGYM_IMPALA.updated(
        batch_size=256,
        learning_rate=1e-3,
        lr_warmup_updates=0,
        grad_clip=4.0,
        optimizer="adam",
        adam_eps=1e-6,
        algorithm="ppo",
        epochs=2,
        minibatches=4,
        targets="gae",
        clip_coef=0.1,
        popart_sigma_floor=0.0,  # IMPALA's: PPO standardises its advantages per minibatch
        # running observation mean/variance (SF's normalize_input): with k = M = 4 no gradient
        # writes RepeatPrevious's card, and without it 2-3 seeds in 10 stayed memoryless
        obs_norm=True,
    ),
    "control": CONTROL,
    # Streaming (r2ac/rl/stream/ac.py, docs/rules/stream.md): stream AC(lambda)
    # of Elsayed et al. 2024 with the anchors' values (Farr et al. 2026: an RTU of 64 features,
    # ObGD alpha 1.0, kappa 3 actor / 2 critic, lambda 0.8, gamma 0.99), one stream per agent,
    # an update every step. MemoryChain: no previous action or reward as input (a memoryless
    # agent could carry the bit in them). Entropy 0.01, Elsayed et al.'s default (the anchors'
    # 0.095 is POPGym's; at length 128 it left every agent on a fixed answer too).
    "stream": STREAM,
    # Stream AC(lambda) with intentional updates (r2ac/rl/stream/intentional.py,
    # docs/rules/intentional.md) in place of ObGD, the etas of Sharifnassab et al. 2026's
    # public code (0.05 actor, 0.5 critic; lambda 0.8, gamma 0.99, entropy 0.01 as `stream`).
    "stream-intentional": STREAM.updated(
        stream_optimizer="intentional", eta_actor=0.05, eta_critic=0.5
    ),
    # QRC(lambda) (r2ac/rl/stream/qrc.py, docs/rules/stream.md): the value-based
    # streaming agent Farr et al. 2026 ran on MemoryChain, with their values (their repo
    # recurrent-streaming-rl: config/algorithm/qrc.yaml, config/hyperparameters/qrc/gymnax/
    # bsuite/memory_chain.yaml, src/recipes/qrc_bsuite.py). Discrete actions only.
    "stream-q": STREAM_Q,
    # Q(lambda) with intentional updates and Watkins's cut (r2ac/rl/stream/intentional_q.py,
    # docs/rules/intentional.md): the anchor's recurrent Q(lambda) (no h network) with its
    # Intentional optimiser (recurrent-streaming-rl: config/algorithm/intentional_q.yaml,
    # config/optimizer/intentional.yaml): eta 0.5, lambda 0.8, gamma 0.99, epsilon 1 -> 0.01 over
    # 10% of the steps; the network and the rest as `stream-q`.
    "stream-intentional-q": STREAM_Q.updated(
        stream_optimizer="intentional", eta_q=0.5, learning_rate=1.0, trace_lambda=0.8
    ),
    # Masked MuJoCo (the RTU paper's position-only / velocity-only locomotion; docs/envs.md):
    # the control recipe, untuned for MuJoCo beyond it, without the last reward in the core's
    # input: HalfCheetah's reward is its forward velocity, so with it a "memoryless" agent
    # sees what the mask hides (measured: feedforward on HalfCheetah-P with the reward input
    # 1,056 / 1,110 greedy in 2 of 3 seeds, level with the recurrent cores).
    "mujoco": CONTROL.updated(env="masked/HalfCheetah-P", last_reward=False),
    # The IMPALA recipe for POPGym (the preset `popgym` was this until the PPO learner; the
    # POPGym grids of docs/results.md ran it). Measured on RepeatFirstEasy and RepeatPreviousEasy
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
    "popgym-impala": POPGYM_IMPALA,
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


# Values a preset gives the cores of one family only (the tuning protocol's step 5, docs/rl.md:
# a family that needs its own values gets them written next to the preset). They apply when
# `--core` is of that family, under any flag the command line gives (`preset_for`).
# A key may also name one core ("elstm-rtrl") for an option only that rule has; its values
# win over its family's. Why each (the screens behind them, and those that lost, are in
# docs/results.md, "Tried, not taken"):
# - elstm epochs 4: more epochs overfit a batch (the CountRecallEasy check fell at 6 and 8).
# - elstm hidden 256, stem norm, lr 2e-3 constant: the eLSTM learns RepeatPrevious with them.
# - elstm entropy floor 0.8 nats, capped at 0.6 of the largest entropy: keeps exploring; the
#   cap keeps two-action envs (ln 2 < 0.8) from being held at the uniform policy.
# - elstm-rtrl start correction: exact RTRL's first-order start state for each segment.
# - lstm grad clip 0.5: the LSTM's RepeatPrevious needs it; it lowers the eLSTM's.
FAMILY_VALUES: dict[str, dict[str, dict[str, Any]]] = {
    "popgym": {
        "elstm": dict(
            epochs=4,
            hidden_size=256,
            stem_norm=True,
            entropy_floor=0.8,
            entropy_floor_cap=0.6,
            learning_rate=2e-3,
            lr_decay=False,
        ),
        "elstm-rtrl": {"rtrl_start_correction": True},
        "lstm": {"grad_clip": 0.5},
    },
    # The eLSTM's forget bias as in the delayed-cue preset: at the default 1 it forgets within
    # a few steps and stays at chance on MemoryChain 32; at 4.5 it solves it (docs/results.md).
    "stream": {"elstm": {"forget_bias": 4.5}},
    "stream-intentional": {"elstm": {"forget_bias": 4.5}},
}


def preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def family_values(name: str | None, core: str) -> dict[str, Any]:
    """The values preset `name` gives `core` (`FAMILY_VALUES`), by flat names: its family's
    ("elstm"), then those of the core itself ("elstm-rtrl"), which win."""
    given = FAMILY_VALUES.get(name or "", {})
    return {**given.get(core.split("-", 1)[0], {}), **given.get(core, {})}


def preset_for(name: str, core: str) -> TrainConfig:
    """Preset `name` with `core` and the values it gives that core's family."""
    return preset(name).updated(core=core, **family_values(name, core))


def preset_overrides(name: str) -> dict:
    """The fields in which preset `name` differs from TrainConfig's defaults."""
    base, chosen = TrainConfig().flat(), preset(name).flat()
    return {k: v for k, v in chosen.items() if v != base[k]}


def _listed(values: dict[str, Any], quote: str = "") -> str:
    return ", ".join(f"{quote}{k}={v}{quote}" for k, v in values.items())


def _family_suffix(name: str, quote: str = "") -> str:
    """The suffix "; lstm cores: grad_clip=0.5" per family value of preset `name` ("" if none)."""
    return "".join(
        f"; {family}{'' if '-' in family else ' cores'}: {_listed(extra, quote)}"
        for family, extra in FAMILY_VALUES.get(name, {}).items()
    )


def preset_table() -> str:
    """Markdown table of every preset's values that differ from the defaults (docs/rl.md
    shows it verbatim; a test keeps the two equal)."""
    lines = ["| preset | values (beyond TrainConfig's defaults) |", "|---|---|"]
    for name in PRESETS:
        values = _listed(preset_overrides(name), "`") + _family_suffix(name, "`")
        lines.append(f"| {name} | {values or '(the defaults)'} |")
    return "\n".join(lines)


def preset_help(width: int = 100, streaming: bool | None = None) -> str:
    """The presets as `r2ac train --help` lists them: each name and its values beyond
    TrainConfig's defaults (the same values as preset_table), wrapped to `width`; only the
    streaming (or only the batched) ones where `streaming` says which."""
    import textwrap

    pad = max(len(name) for name in PRESETS) + 4
    lines = ["Presets (--preset NAME; its values beyond TrainConfig's defaults, then flags):"]
    names = [n for n in PRESETS if streaming is None or PRESETS[n].streaming == streaming]
    for name in names:
        values = _listed(preset_overrides(name)) + _family_suffix(name)
        lines += textwrap.wrap(
            values or "(the defaults)",
            width,
            initial_indent=f"  {name:<{pad - 2}}",
            subsequent_indent=" " * pad,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


__all__ = [
    "FAMILY_VALUES",
    "PRESETS",
    "family_values",
    "preset",
    "preset_for",
    "preset_table",
    "preset_help",
]
