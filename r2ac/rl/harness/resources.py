"""The memory check before a run starts: the run's trainer estimates what it will hold
(`memory_estimate(cfg)`: bytes by part, each with the options that size it; the batched
runtimes' in r2ac/rl/runtimes/memory.py, the streaming agents' from K, the hidden size and
the widths), and a run whose estimate exceeds the memory available now is refused with one
line naming what to lower (ConfigError, exit code 2). R2AC_SKIP_MEMORY_CHECK=1 turns the
check off.
"""

from __future__ import annotations

import os

from r2ac.errors import ConfigError
from r2ac.perf import available_bytes
from r2ac.rl.config import TrainConfig
from r2ac.rl.harness.trainers import trainer_class

GIB = 2**30


def refusal(parts: dict[str, tuple[int, str]], available: int) -> str | None:
    """The one-line refusal if the parts exceed `available` bytes, else None."""
    total = sum(b for b, _ in parts.values())
    if total <= available:
        return None
    name, (size, option) = max(parts.items(), key=lambda kv: kv[1][0])
    return (
        f"this run needs about {total / GIB:.1f} GiB ({name} {size / GIB:.1f} GiB) but "
        f"{available / GIB:.1f} GiB are available; lower {option} "
        "(R2AC_SKIP_MEMORY_CHECK=1 skips this check)"
    )


def check_resources(cfg: TrainConfig) -> None:
    """ConfigError if the run would not fit in the memory available now."""
    if os.environ.get("R2AC_SKIP_MEMORY_CHECK") == "1":
        return
    available = available_bytes()
    if available is None:
        return
    message = refusal(trainer_class(cfg).memory_estimate(cfg), available)
    if message:
        raise ConfigError(message)
