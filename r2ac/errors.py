"""Errors shared across the package."""


class ConfigError(ValueError):
    """Bad user input (unknown name, wrong size, mismatched checkpoint).

    The CLI turns it into a one-line message and exit code 2, before anything is written.
    """


class MissingDependencyError(ImportError):
    """An optional backend is not installed; the message names the package to install."""


# errno -> (what happened, what to do): a write that fails for want of room or of a right
_WRITE_FAILURES = {
    "ENOSPC": ("the disk is full", "free space"),
    "EDQUOT": ("the disk quota is used up", "free space"),
    "EFBIG": ("the file size limit (ulimit -f) was reached", "raise the limit (ulimit -f)"),
    "EROFS": ("the file system is read-only", "make it writable"),
}


def write_failure(exc: BaseException) -> tuple[str, str] | None:
    """(what happened, what to do) for an OSError of a full disk, a quota, the file size
    limit or a read-only file system; None for any other error."""
    import errno

    if not isinstance(exc, OSError):
        return None
    for name, said in _WRITE_FAILURES.items():
        if exc.errno == getattr(errno, name, None):
            return said
    return None


def write_failure_line(exc: BaseException, then: str = "run it again") -> str | None:
    """One line for `write_failure`'s errors, naming the file: "cannot write F: the disk is
    full; free space, then run it again"; None for any other error."""
    said = write_failure(exc)
    if said is None:
        return None
    what, remedy = said
    where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
    return f"cannot write{where}: {what}; {remedy}, then {then}"


def naming_file(exc: ConfigError, path, *others) -> ConfigError:
    """`exc`'s message with the file it is about named first, unless it names that file (or
    one of `others`, e.g. the run's config.json) already: a loader's value error must say
    which file holds the bad value."""
    text = str(exc)
    named = any(str(p) in text for p in (path, *others))
    return ConfigError(text if named else f"{path}: {text}")


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
    long = [q.name for q in (p, *p.parents) if len(os.fsencode(q.name)) > 255]
    if long:  # NAME_MAX of Linux's file systems; Path.exists would raise for it
        raise ConfigError(f"{option} {path}: a name longer than 255 bytes ({long[0][:40]}...)")
    if is_file and p.is_dir():
        raise ConfigError(f"{option} {path} is a folder, not a file")
    start = p.parent if is_file else p
    existing = next(q for q in (start, *start.parents) if q.exists())
    if not existing.is_dir():
        raise ConfigError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: {existing} is not writable")
    if is_file:
        _probe_file(p, existing, option, path)


def _probe_file(p, existing, option: str, path) -> None:
    """ConfigError unless a file can really be created at `p` (the nearest existing folder
    `existing`): the permission bits pass for root on a read-only disk, and a FIFO, a device
    or a name too long fail only when written; a probe file is created and removed there,
    and an existing target is opened for appending (nothing written)."""
    import os
    import stat
    import tempfile

    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    long = [q.name for q in (p, *p.parents) if len(os.fsencode(q.name)) > name_max]
    if long:
        raise ConfigError(f"{option} {path}: a name longer than {name_max} bytes")
    if os.path.lexists(p):
        try:
            mode = os.stat(p).st_mode
        except OSError:
            raise ConfigError(f"{option} {path} is a dangling link") from None
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{option} {path} is not a regular file (a device, FIFO or socket)")
    try:
        if os.path.lexists(p):
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        else:
            fd, probe = tempfile.mkstemp(dir=existing, prefix=".r2ac-probe-")
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot write there ({exc.strerror})") from None
