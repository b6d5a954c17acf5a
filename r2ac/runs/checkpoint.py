"""Crash-safe, checksummed checkpoint files of plain data.

A checkpoint file is two header lines and a ``torch.save`` body::

    R2AC-CHECKPOINT 1
    sha256 <hex digest of the body> <body length in bytes>
    <torch.save bytes of {"schema": 2, "content": ...}>

``save_atomic`` writes it to a temporary file in the target's directory, flushes and fsyncs
it, then renames it over the target with ``os.replace``: a crash at any point leaves either
the previous file or the new one, never a partial file, and the checksum travels with the
data it covers. ``load`` checks the digest before unpickling anything and then unpickles
with ``weights_only=True``, so a checkpoint can hold data only, never code: a garbled or
truncated file is refused with one line naming it, and so is a pickled callable.

Schema 2: the content is plain data (r2ac.runs.plain: tensors, numbers, strings, None, in
lists, tuples and dicts) and names no type. Each value of another type is written in plain
form by its owner and rebuilt by its reader, which knows the type it wants: a core state
as a dict of its fields (r2ac.rtrl.state), env and RNG states with their numpy arrays as
tensors. ``save_atomic`` refuses anything else; ``load`` refuses a body that is not plain.

Older files are converted on reading (r2ac.runs.older_checkpoints), through a fixed table of
the type names they hold, never importing one: schema 1 (this framing, numpy values and
NamedTuples as tagged dicts) and a bare ``torch.save`` from before the framing (read without
a checksum, with a warning). ``python -m r2ac.runs.checkpoint convert FILE`` rewrites such a
file in schema 2.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import pickle
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from r2ac.errors import ConfigError
from r2ac.runs import older_checkpoints, plain, schema

log = logging.getLogger(__name__)

MAGIC = b"R2AC-CHECKPOINT 1\n"
SCHEMA = 2  # the version of the body's content, its "schema" key
CONVERT_HINT = "python -m r2ac.runs.checkpoint convert"
TEMP_SUFFIX = ".tmp"
GIB = 2**30
MIN_LIMIT = 1 * GIB  # the smallest size limit, however little memory is free
DEFAULT_LIMIT = 64 * GIB  # where the memory available cannot be read


class CheckpointError(ConfigError):
    """A file that is not a readable, intact, data-only checkpoint (exit code 2 at the CLI)."""


def framed(obj: Any) -> dict:
    """What `save_atomic` pickles for `obj`: its schema and it. TypeError (a bug of the writer,
    not of a file) for content that is not plain data."""
    found = plain.problem(obj)
    if found:
        raise TypeError(f"checkpoint: {found} (its owner must write it as plain data)")
    return {"schema": SCHEMA, "content": obj}


def content(raw: Any, checked: bool) -> Any:
    """The content of an unpickled body in schema 2's plain data: a schema-2 body's as it is
    (refused unless plain), an older one's converted (CheckpointError, without the path)."""
    if isinstance(raw, dict) and "schema" in raw and set(raw) <= {"schema", "content"}:
        version = raw["schema"]
        if type(version) is not int or version < SCHEMA:
            raise CheckpointError(f"unknown schema {str(version)[:40]!r}")
        if version > SCHEMA:
            raise CheckpointError(
                f"schema {version}: written by a newer r2ac (this one reads schema {SCHEMA} "
                "and older); use that version"
            )
        if "content" not in raw:
            raise CheckpointError("no content")
        found = plain.problem(raw["content"])
        if found:
            raise CheckpointError(f"refused: {found}")
        return raw["content"]
    try:  # schema 1, or a bare torch.save (its objects already replaced by stand-ins)
        obj = older_checkpoints.from_schema_1(raw) if checked else raw
        obj = older_checkpoints.from_objects(obj)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    found = plain.problem(obj)
    if found:
        raise CheckpointError(f"refused: {found}")
    return obj


# --- file format -------------------------------------------------------------------------------


# The digest is taken this many bytes at a time: one call over a body of gigabytes is one C
# call of seconds, through which a SIGTERM / SIGINT would wait (its handler runs between calls).
_HASH_CHUNK = 1 << 24


def sha256_hex(data) -> str:
    """The SHA-256 of `data` (bytes-like), in chunks (see _HASH_CHUNK)."""
    view, digest = memoryview(data).cast("B"), hashlib.sha256()
    for start in range(0, len(view), _HASH_CHUNK):
        digest.update(view[start : start + _HASH_CHUNK])
    return digest.hexdigest()


def to_parts(obj: Any) -> tuple[bytes, memoryview]:
    """The file as (header lines with the body's SHA-256, the torch.save body); two parts,
    so that a large checkpoint is not copied once more to join them."""
    buffer = io.BytesIO()
    torch.save(framed(obj), buffer)
    body = buffer.getbuffer()
    digest = sha256_hex(body)
    return MAGIC + f"sha256 {digest} {len(body)}\n".encode(), body


def size_limit() -> int:
    """The largest checkpoint `load` reads: R2AC_MAX_CHECKPOINT_GIB if set, else half the
    memory available now (a file is read whole and then unpickled: about twice its size),
    at least MIN_LIMIT. Real checkpoints are far smaller (an agent.pt of the largest preset
    is a few MB, its latest.pt tens of MB)."""
    given = os.environ.get("R2AC_MAX_CHECKPOINT_GIB")
    if given:
        try:
            gib = float(given)
        except ValueError:
            gib = math.nan
        if not (math.isfinite(gib) and 0 < gib <= 2**20):
            raise ConfigError(
                f"R2AC_MAX_CHECKPOINT_GIB={given!r} must be a number of GiB in (0, 1048576]"
            )
        return max(1, int(gib * GIB))
    from r2ac.perf import available_bytes

    available = available_bytes()
    headroom = process_headroom()
    if headroom is not None:
        available = min(available, headroom) if available else headroom
    if not available:
        return DEFAULT_LIMIT
    return max(MIN_LIMIT, available // 2) if headroom is None else available // 2


def process_headroom() -> int | None:
    """The bytes this process may still allocate under its own limits, if it has any: the
    address-space and data limits (ulimit -v / -d, less what it uses now) and its cgroup's
    memory limit (less the group's usage); None where none is set."""
    found = []
    try:
        import resource

        status = _proc_status()
        for res, used_key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
            soft = resource.getrlimit(res)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                found.append(max(0, soft - status.get(used_key, 0)))
    except (ImportError, OSError, ValueError):
        pass
    cgroup = _cgroup_headroom()
    if cgroup is not None:
        found.append(cgroup)
    return min(found) if found else None


def _proc_status() -> dict[str, int]:
    """VmSize, VmData, ... of /proc/self/status in bytes ({} where there is none)."""
    out = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _read_number(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_limit(controllers: str, group: str) -> tuple[int | None, int | None]:
    """(limit, usage) of the memory cgroup a /proc/self/cgroup line names; limit None if
    there is none (v2's "max", v1's huge number) or this is no memory line."""
    if controllers == "":  # v2
        names, limit_name, usage_name = ("/sys/fs/cgroup",), "memory.max", "memory.current"
    elif "memory" in controllers.split(","):  # v1
        names, limit_name = ("/sys/fs/cgroup/memory",), "memory.limit_in_bytes"
        usage_name = "memory.usage_in_bytes"
    else:
        return None, None
    for base in (names[0] + group.rstrip("/"), names[0]):
        limit = _read_number(f"{base}/{limit_name}")
        if limit is not None:
            return (limit if limit < 2**60 else None), _read_number(f"{base}/{usage_name}")
    return None, None


def _cgroup_headroom() -> int | None:
    """The cgroup's memory limit less its usage (cgroup v2 or v1); None without a limit."""
    try:
        with open("/proc/self/cgroup", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            limit, used = _cgroup_limit(parts[1], parts[2])
            if limit is not None:
                return max(0, limit - (used or 0))
    return None


def _check_size(path: Path, size: int) -> None:
    limit = size_limit()
    if size > limit:
        how = (
            "R2AC_MAX_CHECKPOINT_GIB"
            if os.environ.get("R2AC_MAX_CHECKPOINT_GIB")
            else (
                "half the memory available now, within the process's limits (ulimit -v, "
                "cgroup); R2AC_MAX_CHECKPOINT_GIB sets it"
            )
        )
        raise CheckpointError(
            f"{path}: {size / GIB:.1f} GiB is more than a checkpoint may be (limit "
            f"{limit / GIB:.1f} GiB: {how}); refused without reading it"
        )


def _read_checked(f, path: Path, size: int) -> bytes:
    """The body of a file in the checksummed format (`f` after MAGIC), after checking its
    length (before reading it) and digest."""
    fields = f.readline(200).split()
    if len(fields) != 3 or fields[0] != b"sha256" or not fields[2].isdigit():
        raise CheckpointError(f"{path}: damaged checkpoint header; the file cannot be used")
    stated, actual = int(fields[2]), size - f.tell()
    if actual != stated:
        what = "truncated" if actual < stated else "damaged"
        raise CheckpointError(
            f"{path}: {what} checkpoint ({actual} bytes, the header says {stated}); "
            "the file cannot be used"
        )
    body = f.read()
    if sha256_hex(body) != fields[1].decode(errors="replace"):
        raise CheckpointError(f"{path}: checksum mismatch (the file is corrupted); refusing it")
    return body


def _unpickle(source, path: Path, map_location, legacy: bool) -> Any:
    """The body, weights-only; a bare torch.save (`legacy`) with the stand-ins of an older
    checkpoint's types (r2ac.runs.older_checkpoints), never the types themselves."""
    try:
        if legacy:
            return older_checkpoints.load_bare(source, map_location)
        return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if not _names_an_object(str(exc)):  # garbled bytes, not a pickle at all
            raise CheckpointError(f"{path}: {_not_a_checkpoint(legacy, _reason(exc))}") from exc
        raise CheckpointError(
            f"{path}: refused: the checkpoint holds objects other than data (it could run code)"
        ) from exc
    except RecursionError as exc:
        raise CheckpointError(f"{path}: refused: nested too deeply to be a checkpoint") from exc
    except Exception as exc:  # noqa: BLE001  (torch raises many kinds for a foreign file)
        raise CheckpointError(f"{path}: {_not_a_checkpoint(legacy, _reason(exc))}") from exc


def _names_an_object(message: str) -> bool:
    """Whether torch's weights-only refusal is about a class or function the file names (a
    pickle that could run code), not about bytes that are no pickle."""
    return any(s in message for s in ("GLOBAL", "Can only create", "Can only build"))


def _reason(exc: BaseException) -> str:
    """The line of torch's message that says what was wrong (its advice left out)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    after = [ln for i, ln in enumerate(lines) if i and "WeightsUnpickler error" in lines[i - 1]]
    text = (after or lines or [type(exc).__name__])[0]
    return "empty file" if isinstance(exc, EOFError) and not str(exc) else text[:120]


def _not_a_checkpoint(legacy: bool, reason: str) -> str:
    if legacy:
        return f"not a checkpoint (neither the {MAGIC.decode().strip()} format nor a torch.save file: {reason})"
    return f"the checkpoint body cannot be read ({reason})"


def _check_magic(head: bytes, path: Path) -> None:
    """A file that starts like the checkpoint format but not with its exact first line."""
    if head[:8] == MAGIC[:8] and head != MAGIC:
        first = head.split(b"\n")[0].decode(errors="replace")
        raise CheckpointError(
            f"{path}: damaged checkpoint header (first line {first!r}, expected "
            f"{MAGIC.decode().strip()!r}); the file cannot be used"
        )


def special_kind(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists but is no regular file (nor a link to one): "a folder",
    "a FIFO (named pipe)", "a device", "a socket", "a dangling symlink (to X)", "a symlink to
    a device", ...; None for a regular file or nothing at all. Reading one would hang (a
    FIFO), never end (/dev/zero) or fail with a misleading message."""
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    prefix = ""
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError:
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            return f"a dangling symlink (to {target[:200]})"
        prefix = "a symlink to "
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        kind = "a folder"
    elif stat.S_ISFIFO(st.st_mode):
        kind = "a FIFO (named pipe)"
    elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        kind = "a device"
    elif stat.S_ISSOCK(st.st_mode):
        kind = "a socket"
    else:
        kind = "not a regular file"
    return prefix + kind


def _open(path: Path):
    kind = special_kind(path)
    if kind:
        raise CheckpointError(f"{path} is {kind}, not a checkpoint file")
    try:
        # O_NONBLOCK: a FIFO put in its place since the check above does not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it ({exc.strerror})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{path} is not a regular file, not a checkpoint file")
    return os.fdopen(fd, "rb")


def _read(path: Path, map_location) -> tuple[Any, bool]:
    """The unpickled body of `path`, and whether it had a checksum."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        _check_size(path, size)
        try:
            head = f.read(len(MAGIC))
            if head == MAGIC:
                body = _read_checked(f, path, size)
                return _unpickle(io.BytesIO(body), path, map_location, False), True
            _check_magic(head, path)
            f.seek(0)
            return _unpickle(f, path, map_location, True), False  # torch reads what it needs
        except MemoryError:
            raise CheckpointError(
                f"{path}: not enough memory to read it ({size / GIB:.2f} GiB); the process's "
                "limits (ulimit -v, cgroup) leave less than that"
            ) from None


def load(
    path: str | os.PathLike,
    map_location: str | torch.device | None = "cpu",
    expect: Any = object,
    what: str = "checkpoint",
) -> Any:
    """The content of a checkpoint written by ``save_atomic`` (or an older one, converted):
    size, digest checked, weights-only, plain data, and checked against `expect` (a spec of r2ac.runs.schema: the structure the caller needs;
    `what` names the kind of file in the refusal).

    Raises FileNotFoundError for a missing file and CheckpointError (a ConfigError) for a
    folder, a file too large, a corrupted, truncated, foreign, code-carrying or malformed
    one. A bare ``torch.save`` file of data only (an old ``agent.pt``, a pre-trained
    state_dict) loads without a checksum, with a warning.
    """
    path = Path(path)
    raw, checked = _read(path, map_location)
    try:
        obj = content(raw, checked)
        found = schema.problem(obj, expect)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointError(f"{path}: refused: nested too deeply to be a checkpoint") from exc
    if found:
        raise CheckpointError(f"{path}: not a {what}: {found}")
    if not checked:
        log.warning(
            "%s has no checksum (written by an older version); `%s %s` adds one",
            path,
            CONVERT_HINT,
            path,
        )
    return obj


def fsync_directory(directory: Path) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(data: bytes | tuple, path: str | os.PathLike) -> Path:
    """Write ``data`` (bytes, or a tuple of bytes-like parts written in turn) to ``path``
    atomically (temp file, fsync, rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in data if isinstance(data, tuple) else (data,):
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """Save ``obj`` (data only) to ``path`` in the checksummed format, atomically."""
    return write_atomic(to_parts(obj), path)


def remove_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Delete the temp files of writes killed mid-way (``.NAME.*.tmp``); returns them.

    Call only while holding the directory's lock: a live writer's temp file looks the same.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.glob(".*" + TEMP_SUFFIX) if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


LOCK_NAME = ".lock"


def lock_directory(directory: str | os.PathLike) -> int:
    """Hold an exclusive lock on ``directory/.lock`` for the life of this process (or until
    ``os.close`` of the returned descriptor); ConfigError if another process holds it.

    ``fcntl.flock`` locks die with their process, so a killed run never leaves a stale lock.
    """
    import fcntl

    path = Path(directory) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"{directory}: cannot create its lock file ({exc.strerror}); "
            "a run directory must be writable"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"{directory} is in use by another process (pid {holder}); "
            "wait for it to finish or stop it"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def convert(path: str | os.PathLike) -> Path:
    """Rewrite a checkpoint of an older schema (or a bare torch.save) in schema 2, read as
    `load` reads it: weights-only, nothing imported by a name in the file."""
    path = Path(path)
    return save_atomic(load(path), path)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "convert":
        print(f"usage: {CONVERT_HINT} FILE... (older checkpoints, rewritten in schema {SCHEMA})",
              file=sys.stderr)  # fmt: skip
        return 2
    for name in argv[1:]:
        try:
            print(f"converted {convert(name)}")
        except (OSError, ConfigError) as exc:
            print(f"{name}: cannot convert: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
