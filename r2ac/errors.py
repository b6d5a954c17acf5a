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
