"""Errors shared across the package."""


class ConfigError(ValueError):
    """Bad user input (unknown name, wrong size, mismatched checkpoint).

    The CLI turns it into a one-line message and exit code 2, before anything is written.
    """


class MissingDependencyError(ImportError):
    """An optional backend is not installed; the message names the package to install."""


def require(module: str, package: str, extra: str | None = None):
    """Import an optional module or raise MissingDependencyError saying what to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = f"pip install '{package}'"
        if extra:
            hint += f" (or: pip install -e '.[{extra}]')"
        raise MissingDependencyError(f"{module!r} is not installed; {hint}") from exc


def check_writable(path, option: str, is_file: bool = False) -> None:
    """ConfigError unless `path` (a folder, or with `is_file` a file) can be written by this
    user: its nearest existing ancestor is a folder and writable. Checked before a job
    runs, so that a bad output path fails in a second, not after hours."""
    import os
    from pathlib import Path

    p = Path(path).absolute()
    if is_file and p.is_dir():
        raise ConfigError(f"{option} {path} is a folder, not a file")
    start = p.parent if is_file else p
    existing = next(q for q in (start, *start.parents) if q.exists())
    if not existing.is_dir():
        raise ConfigError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: {existing} is not writable")
