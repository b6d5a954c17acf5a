"""Named experiment grids: which training runs make up a table of the paper, at laptop scale.

A grid is a list of tasks (table columns) and variants (table rows, a core/rule and a segment
length M); every (task, variant, seed) is one `r2ac train` run. Tasks and variants are plain
TrainConfig overrides, so a grid says exactly what differs between its runs and nothing
else: everything not named comes from the task's preset.

The spans are scaled to what two CPU cores can train in minutes: the long-span built-in
task is the delayed cue with a 33-step memory (cue at t = 0, choice at t = 33, 34-step
episodes), so M = 5 and 10 are far shorter than the span, while a 50-step segment holds a
whole episode about a third of the time and a 100-step one about two thirds (M = 5, 10, 50
are the issue's values; 100 was added when TBPTT at 50 learned in only one seed of three).

Streaming rows (`Variant(core, None)`, `--preset stream` / `stream-q`) have no segment length:
their label is the core alone. In a grid with `lockstep_seeds` such a row is one run of all
its seeds (`--num-agents K`, seeds 0 .. K-1 in one process, a K-agent step costing little
more than a 1-agent one), and the report reads each seed's score from that run's eval.json.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from r2ac.errors import ConfigError

# A variant's segment length that means "the task's longest episode": full BPTT for a
# truncated-BPTT core on tasks whose episodes all have that length and start together.
FULL_EPISODE = 0


@dataclass(frozen=True)
class Task:
    """A table column: an env and how long to train on it."""

    name: str
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    """Reference scores (random / memoryless / scripted), printed under the table."""
    episode_steps: int | None = None
    """Longest episode (steps): the M of FULL_EPISODE variants."""
    success_at: float | None = None
    """An evaluation score at or above this counts as a success (`success_threshold`: where
    scripted policies give the memoryless level and the optimum); the tables then add the
    seeds that reach it. None: means and spreads only."""


SUCCESS_GAP_FRACTION = 0.8


def success_threshold(memoryless: float, optimum: float) -> float:
    """The score that closes SUCCESS_GAP_FRACTION of the gap from the best memoryless policy's
    score to the optimum."""
    return memoryless + SUCCESS_GAP_FRACTION * (optimum - memoryless)


@dataclass(frozen=True)
class Variant:
    """A table row: a core (with its gradient rule) and a segment length M."""

    core: str
    unroll_length: int | None
    """M; None: a streaming row (`--preset stream`: an update every step, no segments)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    """The row's own preset instead of its task's (e.g. batched PPO beside streaming rows)."""
    name: str | None = None
    """What sets the row apart from another of its core (its overrides), in its label and
    run directory."""

    @property
    def streaming(self) -> bool:
        return self.unroll_length is None

    @property
    def label(self) -> str:
        own = f" (--preset {self.preset})" if self.preset else ""
        own += f" ({self.name})" if self.name else ""
        if self.streaming:
            return f"{self.core}{own}"
        m = "episode" if self.unroll_length == FULL_EPISODE else self.unroll_length
        return f"{self.core} M={m}{own}"


@dataclass(frozen=True)
class Grid:
    name: str
    description: str
    tasks: tuple[Task, ...]
    variants: tuple[Variant, ...]
    default_seeds: int = 3
    suite_score: Callable[[float], float] | None = None
    """Maps a task's score onto a common scale; set, the tables get a "suite" column: the
    mean over tasks of the mapped per-task means (a row with a task missing shows "-")."""
    tasks_at: Callable[[str], tuple[Task, ...]] | None = None
    """The grid's tasks at a difficulty (easy, medium, hard); None: the grid has one."""
    lockstep_seeds: bool = False
    """Streaming rows train all their seeds in one process (`--num-agents K`: agent k has
    seed k, the agents in lockstep, sharing nothing); the report reads each seed's score
    from eval.json's `agents`. Other rows keep one run per seed."""
    success_threshold: float | None = None
    """Set, the report adds a table: the seeds whose evaluation score is >= this, out of N
    (with each seed's score)."""


@dataclass(frozen=True)
class RunSpec:
    """One training run of a grid."""

    task: Task
    variant: Variant
    seed: int
    agents: int = 1
    """Seeds this run trains in lockstep (`--num-agents`): seed .. seed + agents - 1."""

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(range(self.seed, self.seed + self.agents))

    @property
    def preset(self) -> str:
        return self.variant.preset or self.task.preset

    @property
    def run_id(self) -> str:
        """Directory name: readable and unique within the grid."""
        v = self.variant
        parts = [self.task.name, v.core]
        if not v.streaming:
            parts.append(f"M{'ep' if v.unroll_length == FULL_EPISODE else v.unroll_length}")
        if v.preset:
            parts.append(v.preset)
        if v.name:
            parts.append(v.name)
        last = self.seed + self.agents - 1
        parts.append(f"s{self.seed}" if self.agents == 1 else f"s{self.seed}-{last}")
        return _slug("__".join(parts))

    @property
    def unroll_length(self) -> int | None:
        """The variant's M, or the task's longest episode for FULL_EPISODE variants; None
        for a streaming row (its preset's)."""
        if self.variant.unroll_length != FULL_EPISODE:
            return self.variant.unroll_length
        if not self.task.episode_steps:
            raise ConfigError(f"task {self.task.name!r} has no episode_steps for M=episode")
        return self.task.episode_steps

    def overrides(self, total_frames: int | None = None) -> dict[str, Any]:
        """The TrainConfig fields this run sets on top of the task's preset."""
        out = dict(self.task.overrides)
        out.update(core=self.variant.core, seed=self.seed)
        if self.unroll_length is not None:
            out["unroll_length"] = self.unroll_length
        if self.agents > 1:
            out["num_agents"] = self.agents
        out.update(self.variant.overrides)
        if total_frames is not None:
            out["total_frames"] = total_frames
        return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", text)


# Tasks. Reference scores are those of `r2ac bench envs` (docs/results.md, "Environments").
DELAYED_CUE = Task(
    "delayed-cue",
    "delayed-cue",
    {"env_options": ("delay=32",), "total_frames": 5_000_000},
    note="delayed-cue (33-step memory): memoryless bound 0 (exact), scripted 1.00",
)
WATERMAZE = Task(
    "watermaze",
    "watermaze",
    {
        "env_options": ("size=4", "episode_steps=50"),
        "entropy_cost": 0.003,
        "total_frames": 5_000_000,
    },
    note="watermaze 4x4 (50 steps): random 1.70, memoryless 5.94 (cycle; bound ~2H/N = 6.25), "
    "scripted 16.90, oracle 18.97",
)
MINIGRID_MEMORY = Task(
    "minigrid-memory",
    "delayed-cue",
    {
        "env": "minigrid/MemoryS11",
        "env_options": ("max_episode_steps=100",),
        "hidden_size": 128,
        "stem_features": 64,
        "total_frames": 5_000_000,
        "entropy_cost": 0.001,
        "learning_rate": 4e-3,
        "forget_bias": 3.0,
        "freeze_stem": False,
    },
    note="MiniGrid MemoryS11, 100 steps, one-hot observations (envpool; needs the envpool extra): "
    "random 0.075; memoryless 0.46-0.48 (go to the split, pick one side; measured), optimal "
    "~0.91 estimated; S7 and S9 show the cue from the split, so they need no memory",
)
CARTPOLE = Task(
    "cartpole",
    "delayed-cue",
    {
        "env": "envpool/CartPole-v1",
        "env_options": (),
        "freeze_stem": False,
        "total_frames": 1_000_000,
        "learning_rate": 2e-3,
        "entropy_cost": 0.01,
        "forget_bias": None,
        "reward_scale": 0.01,
    },
    note="CartPole-v1 (envpool; fully observed, so memory cannot help): max return 500; rewards "
    "scaled by 0.01 so that values (up to 100 unscaled) fit a linear head on the core's bounded h",
)
MINATAR_BREAKOUT = Task(
    "minatar-breakout",
    "delayed-cue",
    {
        "env": "gym/MinAtar/Breakout-v1",
        "env_options": (),
        "freeze_stem": False,
        "hidden_size": 128,
        "mlp_hidden": (256,),
        "stem_features": 128,
        "total_frames": 3_000_000,
        "learning_rate": 2e-3,
        "entropy_cost": 0.01,
        "forget_bias": None,
    },
    note="MinAtar Breakout (10x10 Atari Breakout, sticky actions 0.1; needs the minatar extra), "
    "reactive: the ball's trail channel makes it Markov; random 0.4",
)
BREAKOUT = Task(
    "breakout",
    "atari",
    {
        "runtime": "serial",
        "num_envs": 16,
        "batch_size": 32,
        "total_frames": 2_000_000,
        "hidden_size": 256,
        "num_threads": 1,
        "checkpoint_every": 200,
        "log_every": 10,
    },
    note="Atari Breakout (envpool; needs the envpool extra), reactive: memory should not matter",
)
# Atari on a CPU: IMPALA's shallow stem (~1 k frames/s per core), one serial job per core.
_ATARI_CPU = {
    "image_stem": "shallow",
    "runtime": "serial",
    "num_envs": 16,
    "batch_size": 16,
    "learning_rate": 2e-3,
    "hidden_size": 256,
    "num_threads": 1,
    "checkpoint_every": 200,
    "log_every": 10,
    "eval_greedy": False,
}
BREAKOUT_CPU = Task(
    "breakout-cpu",
    "atari",
    {**_ATARI_CPU, "total_frames": 1_000_000, "eval_sets": 3, "eval_episodes": 16},
    note="Atari Breakout (envpool) with IMPALA's shallow two-conv stem instead of the ResNet, so "
    "that it trains on a CPU (~1 k frames/s per core); reactive; sampled evaluation, because a "
    "greedy policy that never presses FIRE stalls an episode until the step limit; random 1.4",
)
SEAQUEST_CPU = Task(
    "seaquest-cpu",
    "atari",
    {**_ATARI_CPU, "env": "atari/Seaquest", "total_frames": 500_000},
    note="Atari Seaquest (envpool; the paper's preprocessing) with the shallow stem; reactive (the "
    "oxygen gauge is on screen); learns from the first 100 k frames on a CPU, unlike Breakout; "
    "sampled evaluation 5 x 30 episodes, because at this budget the policies are near uniform "
    "and their argmax is not the policy that was trained; random 76.3",
)

_MEMORY_M = (5, 10, 50, 100)


DIFFICULTIES = ("easy", "medium", "hard")


@dataclass(frozen=True)
class PopgymFamily:
    """One of the 14 families popgym 1.0.7 registers (Easy, Medium and Hard ids each)."""

    name: str
    """Task name (table column) on Easy; `<name>-medium` / `<name>-hard` otherwise."""
    env: str
    """The family in popgym's ids: `gym/popgym-<env><Difficulty>-v0`."""
    episode_steps: tuple[int, int, int]
    """Longest episode (steps) on Easy, Medium, Hard (popgym's max_episode_length)."""
    about: str
    """What the task asks, printed under the table."""
    easy_scores: str = ""
    """Reference scores measured on Easy: the uniform random policy (`r2ac bench random-policy`)
    and the oracle that reads the hidden state (`r2ac.envs.scripted.popgym_oracle_policy`)."""
    memoryless_and_optimum: tuple[float, float] | None = None
    """Where scripted policies give both (every level): the best memoryless policy's score and
    the optimum, for the success threshold. None where no script gives the memoryless level."""


POPGYM_FAMILIES = (
    PopgymFamily(
        "repeat-first",
        "RepeatFirst",
        (51, 415, 831),
        "RepeatFirst (say the first card's suit at every step; span: the episode)",
        "random -0.50, oracle 1.00",
    ),
    PopgymFamily(
        "repeat-previous",
        "RepeatPrevious",
        (51, 103, 155),
        "RepeatPrevious (say the suit of the 4th card back, the current one counted; span 4 "
        "on Easy)",
        "random -0.50, oracle 1.00",
        # the card asked for is independent of what a memoryless agent sees (its previous
        # action and reward included): every such policy is right 1 time in 4
        (-0.5, 1.0),
    ),
    PopgymFamily(
        "count-recall",
        "CountRecall",
        (51, 103, 207),
        "CountRecall (how often was this card's value seen; span: the episode)",
        "random -0.93",
    ),
    PopgymFamily(
        "autoencode",
        "Autoencode",
        (103, 207, 311),
        "Autoencode (watch the suits, then say them back; span: the episode)",
        "random -0.52",
    ),
    PopgymFamily(
        "higher-lower",
        "HigherLower",
        (51, 103, 155),
        "HigherLower (will the next card be higher; card counting helps)",
        "random 0.01",
    ),
    PopgymFamily(
        "concentration",
        "Concentration",
        (104, 208, 104),
        "Concentration (flip matching pairs)",
        "random -0.21",
    ),
    PopgymFamily(
        "position-cartpole",
        "PositionOnlyCartPole",
        (200, 400, 600),
        "CartPole seeing positions only (velocities must be inferred; span 2+)",
        "random 0.11",
    ),
    PopgymFamily(
        "velocity-cartpole",
        "VelocityOnlyCartpole",
        (200, 400, 600),
        "CartPole seeing velocities only (positions must be integrated)",
        "random 0.11",
    ),
    PopgymFamily(
        "noisy-position-cartpole",
        "NoisyPositionOnlyCartPole",
        (200, 200, 200),
        "CartPole seeing noisy positions only (velocities inferred through the noise)",
    ),
    PopgymFamily(
        "position-pendulum",
        "PositionOnlyPendulum",
        (200, 150, 100),
        "Pendulum seeing the angle only, Box(1) torque (velocity must be inferred)",
    ),
    PopgymFamily(
        "noisy-position-pendulum",
        "NoisyPositionOnlyPendulum",
        (200, 200, 200),
        "Pendulum seeing a noisy angle only, Box(1) torque",
    ),
    PopgymFamily(
        "multiarmed-bandit",
        "MultiarmedBandit",
        (200, 400, 600),
        "MultiarmedBandit (find the best arm from past rewards; span: the episode)",
    ),
    PopgymFamily(
        "battleship",
        "Battleship",
        (64, 100, 144),
        "Battleship (MultiDiscrete cell; remember where one has fired and hit)",
    ),
    PopgymFamily(
        "minesweeper",
        "MineSweeper",
        (14, 30, 54),
        "MineSweeper (MultiDiscrete cell; remember the revealed counts)",
    ),
)


def popgym_task(family: PopgymFamily, difficulty: str = "easy") -> Task:
    """A POPGym env of `family` at `difficulty` on the popgym preset. Every POPGym return lies
    in [-1, 1] with the optimum at +1 (Morad et al. 2023)."""
    level = DIFFICULTIES.index(difficulty)
    easy = difficulty == "easy"
    scores = f": {family.easy_scores}" if easy and family.easy_scores else ""
    return Task(
        family.name if easy else f"{family.name}-{difficulty}",
        "popgym",
        {"env": f"gym/popgym-{family.env}{difficulty.capitalize()}-v0"},
        note=f"{family.about}{'' if easy else f' ({difficulty})'}{scores}",
        episode_steps=family.episode_steps[level],
        success_at=success_threshold(*family.memoryless_and_optimum)
        if family.memoryless_and_optimum
        else None,
    )


def popgym_tasks(difficulty: str = "easy") -> tuple[Task, ...]:
    """Every registered POPGym family at one difficulty (the columns of the popgym grid)."""
    check_difficulty(difficulty)
    return tuple(popgym_task(f, difficulty) for f in POPGYM_FAMILIES)


def check_difficulty(difficulty: str) -> None:
    if difficulty not in DIFFICULTIES:
        raise ConfigError(
            f"unknown difficulty {difficulty!r}; choose one of {', '.join(DIFFICULTIES)}"
        )


POPGYM_TASKS = popgym_tasks("easy")

GRIDS: dict[str, Grid] = {
    "memory-m": Grid(
        "memory-m",
        "Table 1 / Fig. 1 shape: exact RTRL vs truncated BPTT across segment lengths M on memory "
        "tasks, plus a feedforward (memoryless) agent.",
        (DELAYED_CUE, WATERMAZE, MINIGRID_MEMORY),
        tuple(Variant(core, m) for m in _MEMORY_M for core in ("elstm-rtrl", "elstm-bptt"))
        + (Variant("feedforward", 10),),
    ),
    "ablation": Grid(
        "ablation",
        "Table 2 shape: architectures with TBPTT, SnAp-1 on the feLSTM, and exact RTRL on the "
        "eLSTM, at one short M.",
        (DELAYED_CUE,),
        tuple(
            Variant(core, 10)
            for core in ("lstm-bptt", "felstm-bptt", "elstm-bptt", "felstm-snap1", "elstm-rtrl")
        ),
    ),
    "reactive": Grid(
        "reactive",
        "Reactive tasks, where memory should not matter: RTRL should do no harm against TBPTT "
        "and feedforward. CartPole, MinAtar Breakout, and Atari Seaquest and Breakout with a shallow "
        "stem run on a CPU; Atari Breakout with the paper's ResNet stem needs a GPU.",
        (CARTPOLE, MINATAR_BREAKOUT, SEAQUEST_CPU, BREAKOUT_CPU, BREAKOUT),
        (Variant("feedforward", 20), Variant("elstm-bptt", 20), Variant("elstm-rtrl", 20)),
    ),
}


def popgym_normalised(score: float) -> float:
    """POPGym's normalisation (Morad et al. 2023, the authors' plotting code): every return lies
    in [-1, 1] with the optimum at +1, mapped onto [0, 1]."""
    return 0.5 * score + 0.5


GRIDS["popgym"] = Grid(
    "popgym",
    "POPGym (Morad et al. 2023), someone else's memory benchmark: exact RTRL at a short M "
    "against truncated BPTT at the same M and against full BPTT (LSTM and GRU with M as long as "
    "the episode), plus a memoryless agent; the same frame budget on every env.",
    POPGYM_TASKS,
    (
        Variant("elstm-rtrl", 4),
        Variant("elstm-bptt", 4),
        Variant("lstm-bptt", 4),
        Variant("gru-bptt", 4),
        Variant("lstm-bptt", FULL_EPISODE),
        Variant("gru-bptt", FULL_EPISODE),
        Variant("feedforward", 4),
        # the RTU (exact RTRL on a complex diagonal recurrence) solved RepeatPrevious where
        # the eLSTM and the GRU did not (docs/results.md, "POPGym")
        Variant("rtu-rtrl", 4),
        Variant("rtu-bptt", 4),
    ),
    suite_score=popgym_normalised,
    tasks_at=popgym_tasks,
)


# Streaming: the MemoryChain study of Farr et al. 2026 and their five
# POPGym Easy tasks, with r2ac's stream AC(lambda) (and QRC(lambda)) on each streaming core.
MEMORY_CHAIN_LENGTHS = (2, 4, 8, 16, 32, 64, 128)
MEMORY_CHAIN_EPISODES = 10_000
STREAM_MAX_FRAMES = 1_000_000
STREAM_CORES = ("rtu-rtrl", "elstm-rtrl", "lru-rtrl", "rtu-bptt", "gru-bptt", "feedforward")
# The recurrent cores again with the preset's two layers moved above the core (the core reads
# the observation; layers below it get the current step's gradient only, layers above it
# their exact one): under an exact-RTRL core every parameter's gradient is exact.
STREAM_LAYERS_ABOVE_CORES = ("rtu-rtrl", "elstm-rtrl", "lru-rtrl", "rtu-bptt", "gru-bptt")
LAYERS_ABOVE = "layers above"
STREAM_POPGYM_CORES = ("rtu-rtrl", "elstm-rtrl", "rtu-bptt")
STREAM_POPGYM_FAMILIES = (
    "CountRecall",
    "RepeatFirst",
    "Concentration",
    "Autoencode",
    "HigherLower",
)
STREAM_POPGYM_ENTROPY = 0.095  # the anchor's entropy cost on POPGym (the stream preset: 0.01)


def memory_chain_frames(length: int) -> int:
    """Steps per agent on MemoryChain of `length`: 10,000 episodes or 1 M, whichever is less."""
    return min(MEMORY_CHAIN_EPISODES * length, STREAM_MAX_FRAMES)


def memory_chain_task(length: int, preset_name: str = "stream") -> Task:
    return Task(
        f"memory-chain-{length}",
        preset_name,
        {
            "env": "builtin/memory-chain",
            "env_options": (f"length={length}",),
            "total_frames": memory_chain_frames(length),
        },
        note=f"memory-chain-{length}: the bit shown at step 0 is asked for at step {length - 1}; "
        "chance 0, optimum 1",
        episode_steps=length,
    )


def _stream_memory_chain(preset_name: str, algorithm: str) -> Grid:
    return Grid(
        f"{preset_name}-memory-chain",
        f"MemoryChain lengths 2 .. 128 (Farr et al. 2026): {algorithm} with exact RTRL "
        "(rtu, elstm, lru) against TBPTT(1) (rtu-bptt, gru-bptt) and a memoryless agent, "
        "with the preset's two layers below the core and moved above it; "
        "10,000 episodes or 1 M steps per agent, whichever is less; seeds in lockstep.",
        tuple(memory_chain_task(n, preset_name) for n in MEMORY_CHAIN_LENGTHS),
        tuple(Variant(core, None) for core in STREAM_CORES)
        + tuple(
            Variant(core, None, {"stream_mlp": (), "stream_top_mlp": (128, 128)}, name=LAYERS_ABOVE)
            for core in STREAM_LAYERS_ABOVE_CORES
        ),
        lockstep_seeds=True,
        success_threshold=0.9,
    )


GRIDS["stream-memory-chain"] = _stream_memory_chain("stream", "stream AC(lambda)")
GRIDS["stream-q-memory-chain"] = _stream_memory_chain("stream-q", "QRC(lambda)")

_POPGYM_BY_ENV = {f.env: f for f in POPGYM_FAMILIES}


def _stream_popgym_task(env: str) -> Task:
    task = popgym_task(_POPGYM_BY_ENV[env])
    overrides = {**task.overrides, "prev_action": True, "total_frames": STREAM_MAX_FRAMES}
    return dataclasses.replace(task, preset="stream", overrides=overrides)


GRIDS["stream-popgym"] = Grid(
    "stream-popgym",
    "The five POPGym Easy tasks of Farr et al. 2026, the previous action as input: stream "
    "AC(lambda) (entropy 0.095, the anchor's) on exact RTRL (rtu, elstm) and TBPTT(1) (rtu), "
    "1 M steps per agent, seeds in lockstep, beside r2ac's batched PPO (--preset popgym, "
    "rtu-rtrl, M = 4) at the same 1 M frames a seed.",
    tuple(_stream_popgym_task(env) for env in STREAM_POPGYM_FAMILIES),
    tuple(Variant(c, None, {"entropy_cost": STREAM_POPGYM_ENTROPY}) for c in STREAM_POPGYM_CORES)
    + (Variant("rtu-rtrl", 4, preset="popgym"),),
    suite_score=popgym_normalised,
    lockstep_seeds=True,
)

# Studies that are measurements, not grids of training runs (r2ac.experiments.cli dispatches).
STUDIES = {"cost": "r2ac.bench.cost"}  # the old name of `r2ac bench cost`, kept as an alias


def grid(name: str) -> Grid:
    if name not in GRIDS:
        known = ", ".join([*GRIDS, *STUDIES])
        raise ConfigError(f"unknown experiment {name!r}; choose one of {known}")
    return GRIDS[name]


def select_difficulty(g: Grid, difficulty: str | None) -> Grid:
    """The grid with its tasks at `difficulty` (None: as defined, POPGym's Easy)."""
    if difficulty is None:
        return g
    check_difficulty(difficulty)
    if g.tasks_at is None:
        raise ConfigError(f"grid {g.name!r} has no difficulty levels; leave --difficulty out")
    return dataclasses.replace(g, tasks=g.tasks_at(difficulty))


def select_tasks(g: Grid, names: tuple[str, ...] | None) -> tuple[Task, ...]:
    """The grid's tasks, or the named subset (an unknown name is a ConfigError)."""
    if not names:
        return g.tasks
    known = {t.name: t for t in g.tasks}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"grid {g.name!r} has no task {unknown}; its tasks: {', '.join(known)}")
    return tuple(known[n] for n in names)


def select_unroll_lengths(g: Grid, lengths: tuple[int, ...] | None) -> Grid:
    """The grid with only the rows (variants) of these segment lengths M (all if none given)."""
    if not lengths:
        return g
    known = sorted({v.unroll_length for v in g.variants if not v.streaming})
    unknown = sorted(set(lengths) - set(known))
    if unknown:
        raise ConfigError(f"grid {g.name!r} has no rows with M in {unknown}; its M: {known}")
    return dataclasses.replace(
        g, variants=tuple(v for v in g.variants if v.unroll_length in lengths)
    )


def select_cores(g: Grid, cores: tuple[str, ...] | None) -> Grid:
    """The grid with only the rows (variants) of these cores (all if none given)."""
    if not cores:
        return g
    known = sorted({v.core for v in g.variants})
    unknown = sorted(set(cores) - set(known))
    if unknown:
        raise ConfigError(f"grid {g.name!r} has no rows with core in {unknown}; its cores: {known}")
    return dataclasses.replace(g, variants=tuple(v for v in g.variants if v.core in cores))


def runs_of(g: Grid, seeds: int, tasks: tuple[Task, ...] | None = None) -> list[RunSpec]:
    """Every run of the grid, seeds innermost so that partial grids fill whole rows first; a
    streaming row of a lockstep grid is one run of all its seeds."""
    if seeds < 1:
        raise ConfigError(f"seeds must be >= 1, got {seeds}")
    return [
        spec
        for t in (tasks or g.tasks)
        for v in g.variants
        for spec in (
            [RunSpec(t, v, 0, agents=seeds)]
            if g.lockstep_seeds and v.streaming
            else [RunSpec(t, v, s) for s in range(seeds)]
        )
    ]
