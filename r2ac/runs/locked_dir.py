"""A locked run directory, task-neutral: the lock, stale temp files, JSON, the git revision and
the machine a run ran on.

`r2ac train` (r2ac.rl.run.run_dir.RunDir, which adds config.json, metrics and checkpoints) and
`r2ac copy` (r2ac.tasks.copy_cli) both hold their directory through `LockedDir`, so a second
process on the same directory is refused and a write killed mid-way leaves no temp file.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from r2ac.errors import ConfigError
from r2ac.runs import checkpoint

REVISION_FILE = Path(__file__).resolve().parent.parent / "REVISION"


def archived_revision(text: str) -> str:
    """The commit `git archive` wrote into r2ac/REVISION (export-subst), or "unknown" where the
    file holds its unexpanded placeholder or no 40-hex commit."""
    rev = text.strip()
    return rev if len(rev) == 40 and all(c in "0123456789abcdef" for c in rev) else "unknown"


def git_revision() -> str:
    """The commit this code runs at: from r2ac/REVISION in a tree exported by `git archive`
    (first, so an exported tree inside another repository is not taken for it), from git in a
    checkout, else "unknown"."""
    try:
        archived = archived_revision(REVISION_FILE.read_text(encoding="utf-8"))
    except OSError:
        archived = "unknown"
    if archived != "unknown":
        return archived
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=REVISION_FILE.parent,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC ..."), or the architecture where the OS does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: int = 0) -> dict[str, str | int]:
    """What a run's numbers depend on beyond its config and code: a serial run is bit-identical
    on the same CPU capability and packages, but other SIMD kernels (torch's "AVX2" against
    "AVX512") sum floats in another order, and a 1 M-frame RL run then ends elsewhere.
    `threads`: the torch threads the run will use (0: this process's count now)."""
    import numpy
    import torch

    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "packages": package_versions(),
        "load_average": _load_average(),
    }


# The packages beyond torch and numpy whose versions can move a run's numbers: the envs'
# dynamics and seeding, and the runtimes'.
ENV_PACKAGES = ("gymnasium", "popgym", "envpool", "minigrid", "minatar", "mujoco", "ray")


def package_versions() -> str:
    """The installed ones of ENV_PACKAGES with their versions ("gymnasium 1.4.0, ..."; read
    from their metadata: nothing is imported)."""
    from importlib import metadata

    found = []
    for name in ENV_PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def _load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except (AttributeError, OSError):  # not every OS keeps one
        return "unknown"


# The entries of `machine()` that change a run's floats.
SAME_FLOATS_KEYS = ("cpu_capability", "torch", "numpy", "packages")


def machine_changes(recorded: object, now: dict) -> list[str]:
    """The float-relevant entries in which `now` differs from a run's `recorded` machine, as
    "key: then -> now" ([] when they agree or nothing was recorded)."""
    if not isinstance(recorded, dict):
        return []
    return [
        f"{key}: {recorded[key]} -> {now.get(key)}"
        for key in SAME_FLOATS_KEYS
        if key in recorded and recorded[key] != now.get(key)
    ]


def write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` as indented JSON atomically (temp file, fsync, rename): a kill never leaves
    half a file, and a reader never sees one."""
    return checkpoint.write_atomic((json.dumps(obj, indent=2) + "\n").encode(), path)


MAX_JSON_BYTES = 16 * 2**20  # a config.json is a few kB


def read_json(path: str | Path) -> Any:
    """A JSON file a run wrote (config.json): ConfigError naming the file for one that is
    too large, not UTF-8, not JSON or nested too deeply."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_JSON_BYTES:
            raise ConfigError(f"{p}: {p.stat().st_size} bytes is too large for a config file")
        text = p.read_bytes().decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}); restore the file") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON ({exc}); restore the file") from exc
    except RecursionError as exc:
        raise ConfigError(f"{p}: nested too deeply to be a config file") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{p} is a folder, not a file") from exc


def holds_nothing(path: str | Path) -> bool:
    """True if `path` is absent or a directory holding nothing but a lock file."""
    p = Path(path)
    return not p.exists() or (
        p.is_dir() and not any(q.name != checkpoint.LOCK_NAME for q in p.iterdir())
    )


class LockedDir:
    """A directory held by this process (`acquire`) until `release` or the process ends."""

    lock_fd: int | None = None
    temp_folders: tuple[str, ...] = ()  # subfolders whose stale temp files `acquire` removes

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def acquire(self) -> LockedDir:
        """Lock the directory for this process (ConfigError if another holds it) and remove
        the temp files of writes killed mid-way (safe now: nobody else writes here)."""
        self.lock_fd = checkpoint.lock_directory(self.path)
        for folder in ("", *self.temp_folders):
            checkpoint.remove_stale_temps(self.path / folder)
        return self

    def release(self) -> None:
        """Give up the lock taken by `acquire` (it also dies with the process)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None
