"""`make(name, num_envs, seed, **options)` and `available()`.

Names are "<family>/<task>": builtin/delayed-cue, builtin/memory-chain, atari/Breakout,
procgen/chaser, minigrid/MemoryS13Random, envpool/<task id>, gym/<id>, dmlab/<level>,
masked/<Env>-<P|V> (MuJoCo seeing positions or velocities only); gym/<module>:<id> imports
<module> first (gymnasium.make's form for a user's own registered env).
Backends are imported only when their family is used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from r2ac.envs.base import BatchedEnv, check_options
from r2ac.errors import ConfigError

DEFAULT_ENV = "builtin/delayed-cue"

# family -> (module, factory, example names)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "builtin": (
        "r2ac.envs.builtin",
        "make_builtin",
        "builtin/delayed-cue, builtin/watermaze, builtin/memory-chain, builtin/k-memory-chain",
    ),
    "atari": ("r2ac.envs.envpool_adapter", "make_atari", "atari/Breakout, atari/MsPacman, ..."),
    "procgen": ("r2ac.envs.envpool_adapter", "make_procgen", "procgen/chaser"),
    "minigrid": (
        "r2ac.envs.envpool_adapter",
        "make_minigrid",
        "minigrid/MemoryS7 .. minigrid/MemoryS17Random",
    ),
    "envpool": ("r2ac.envs.envpool_adapter", "make_envpool", "envpool/CartPole-v1"),
    "gym": (
        "r2ac.envs.gym_adapter",
        "make_gym",
        "gym/popgym-RepeatPreviousEasy-v0, gym/MinAtar/Breakout-v1",
    ),
    "masked": (
        "r2ac.envs.masked_mujoco",
        "make_masked",
        "masked/HalfCheetah-P, masked/Hopper-V, ... (MuJoCo, positions or velocities only)",
    ),
    "dmlab": (
        "r2ac.envs.dmlab",
        "make_dmlab",
        "dmlab/rooms_watermaze, dmlab/rooms_select_nonmatching_object",
    ),
}


def _factory(family: str):
    if family not in FAMILIES:
        raise ConfigError(f"unknown env family {family!r}; known: {sorted(FAMILIES)}")
    module, function, _ = FAMILIES[family]
    return getattr(importlib.import_module(module), function)


def make(name: str, num_envs: int, seed: int = 0, **options: Any) -> BatchedEnv:
    """A batch of num_envs streams of env `name`, all seeded from `seed`."""
    family, sep, task = name.partition("/")
    if not sep or not task:
        raise ConfigError(f"env name must look like '<family>/<task>', got {name!r}")
    if num_envs < 1:
        raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
    factory = _factory(family)
    check_options(factory, name, options)
    return factory(task, num_envs, seed, **options)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """["delay=100", "variant=nonmatch"] -> {"delay": 100, "variant": "nonmatch"}."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ConfigError(f"env options are key=value, got {pair!r}")
        if key in options:
            raise ConfigError(f"--env-options gives {key!r} twice ({key}={options[key]!r}, {pair})")
        options[key] = _literal(text)
    return options


def _literal(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class FamilyStatus:
    family: str
    available: bool
    examples: str
    reason: str  # why it is unavailable, or what it runs on


def _import_error(module: str) -> str | None:
    """None if module imports, else a one-line reason."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return str(exc).splitlines()[0] or f"{module} not importable"
    return None


def _probe_envpool_family(family: str) -> tuple[bool, str]:
    if _import_error("envpool"):
        if family == "minigrid" and not _import_error("minigrid"):
            return True, "minigrid package through the gym adapter (envpool missing)"
        return False, "envpool missing: pip install -e '.[envpool]'"
    if family == "procgen" and _import_error("envpool.procgen"):
        return False, "envpool ProcGen cannot load Qt5: apt-get install -y libqt5gui5"
    if family == "minigrid":
        envs = importlib.import_module("envpool").list_all_envs()
        if not any(e.startswith("MiniGrid-Memory") for e in envs):
            return (
                (True, "minigrid package via gym adapter")
                if not _import_error("minigrid")
                else (False, "this envpool lacks MiniGrid; pip install -e '.[minigrid]'")
            )
    return True, "envpool"


def _probe(family: str) -> tuple[bool, str]:
    """Whether a family can run here, and a one-line reason; imports what it checks."""
    if family == "builtin":
        return True, "numpy only"
    if family == "dmlab":
        return (
            (True, "deepmind_lab")
            if not _import_error("deepmind_lab")
            else (False, "deepmind_lab not importable (build it from source, see docs/envs.md)")
        )
    if family == "gym":
        if _import_error("gymnasium"):
            return False, "gymnasium missing: pip install -e '.[gym]'"
        extras = [
            f"{name} {'yes' if not _import_error(module) else f'missing (.[{extra}])'}"
            for name, module, extra in (
                ("popgym", "popgym", "popgym"),
                ("MinAtar", "minatar", "minatar"),
            )
        ]
        return True, f"gymnasium; {', '.join(extras)}"
    if family == "masked":
        missing = _import_error("gymnasium") or _import_error("mujoco")
        if missing:
            return False, f"{missing}: pip install -e '.[mujoco]'"
        return True, "gymnasium's MuJoCo v5 tasks (mujoco package, CPU)"
    return _probe_envpool_family(family)


def available() -> list[FamilyStatus]:
    """Every family, whether it can run on this machine, and why not."""
    statuses = []
    for family, (_, _, examples) in FAMILIES.items():
        ok, reason = _probe(family)
        statuses.append(FamilyStatus(family, ok, examples, reason))
    return statuses
