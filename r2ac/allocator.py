"""jemalloc for the compiled streaming step, where it is installed.

The compiled loop's C++ body (r2ac/rl/stream/compiled_loop.py) allocates its ~100 intermediate
tensors every step: inductor's memory planning, which would carve them from one block, does not
yet compile inside a while_loop. Each goes through posix_memalign with 64-byte alignment, which
glibc serves from its slow path (split chunks, unlinking, consolidation): on the matched
network (an LRU of 32) glibc's malloc and free are ~46 % of a step's CPU time, and with jemalloc
the same step takes ~0.6 of the time (docs/results.md). The eager path gains nothing measurable.

An allocator cannot be changed inside a running process, so `r2ac` re-executes itself once,
first thing, with LD_PRELOAD naming jemalloc, when the command runs the compiled step
(`--compile-step`, or `--resume` of a run that has it) and a jemalloc library is installed
(Debian / Ubuntu: `apt install libjemalloc2`). Results are the same bit for bit: only where
memory comes from changes. R2AC_ALLOCATOR=system keeps glibc's; R2AC_ALLOCATOR=PATH preloads
that library instead.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

CHOICE = "R2AC_ALLOCATOR"  # "system", a library's path, or unset (jemalloc where found)
PRELOADED = "R2AC_ALLOCATOR_PRELOADED"  # set in the re-executed process: never twice


def runs_compiled_step(argv: Sequence[str]) -> bool:
    """Whether the command line runs the compiled streaming step: `--compile-step`, or
    `--resume DIR` where DIR's config.json has it (read as data; anything unreadable: no)."""
    if "--compile-step" in argv:
        return True
    run_dir = _option_value(argv, "--resume")
    if run_dir is None:
        return False
    try:
        config = json.loads((Path(run_dir) / "config.json").read_text())
        return config.get("stream", {}).get("compile_step") is True
    except (OSError, ValueError, AttributeError):
        return False


def _option_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def find_jemalloc() -> str | None:
    """jemalloc's shared library as the dynamic loader names it (None: not installed)."""
    return ctypes.util.find_library("jemalloc")


def preload_environment(
    argv: Sequence[str], environ: Mapping[str, str], jemalloc: str | None
) -> dict[str, str] | None:
    """The environment to re-execute with, or None to run as is: already preloaded, the
    system's allocator chosen, no compiled step in the command, or no library to preload."""
    choice = environ.get(CHOICE, "")
    if environ.get(PRELOADED) or choice == "system" or not runs_compiled_step(argv):
        return None
    library = choice or jemalloc
    if not library:
        return None
    preload = " ".join(p for p in (environ.get("LD_PRELOAD", ""), library) if p)
    return {**environ, "LD_PRELOAD": preload, PRELOADED: library}


def reexec_with_fast_allocator() -> None:
    """Replace this process by itself with jemalloc preloaded where `preload_environment`
    says so (the same command line, interpreter flags included); otherwise return."""
    env = preload_environment(sys.argv[1:], os.environ, find_jemalloc())
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def preloaded_library() -> str | None:
    """The library this process was re-executed with, if it is mapped (None otherwise)."""
    library = os.environ.get(PRELOADED)
    if not library:
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return library  # no /proc: trust the loader
    return library if Path(library).name.split(".so")[0] in maps else None
