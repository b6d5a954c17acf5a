"""Environment variables set for a while: for child processes started inside (Ray's raylet
reads its config from RAY_* variables when it starts) or for one command run in-process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set `values` in os.environ inside the block; put back the old values (or absence) after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
