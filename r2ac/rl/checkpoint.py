"""Crash-safe checkpoint files.

``save_atomic`` writes to a temporary file in the target's directory, flushes and fsyncs it,
then renames it over the target with ``os.replace`` (atomic on POSIX and Windows). A crash at
any point leaves either the previous file or the new one, never a partial file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def _fsync_directory(directory: Path) -> None:
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


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path`` atomically; returns the path. Parent dirs are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def load(
    path: str | os.PathLike,
    map_location: str | torch.device | None = "cpu",
    weights_only: bool = True,
) -> Any:
    """``torch.load`` a checkpoint (tensors moved to ``map_location``).

    ``weights_only=True`` (the safe default) allows tensors, containers and plain Python
    values only; pass False for trusted files that hold other objects.
    """
    return torch.load(Path(path), map_location=map_location, weights_only=weights_only)
