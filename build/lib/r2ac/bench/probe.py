"""One way to measure in a fresh process and get a typed row back.

    row = run_fresh(peak_probe, PeakRow, shape=[10, 32, 256, 257], rule="rtrl")

runs `python -m r2ac.bench.probe r2ac.bench.core:peak_probe '{"shape": ..., "rule": ...}'`:
the child imports the function, calls it with those arguments, and prints the dataclass row(s)
it returns as JSON on its last line of output. The parent rebuilds rows of the declared type
and checks that every argument that is also a field of a row (the configuration the row
describes) came back unchanged, so a row can never carry another configuration's number.

Why a fresh process: peak memory (the resident set's high-water mark, or glibc's caches)
depends on everything the process did before; a new one measures only the probe.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any, TypeVar

Row = TypeVar("Row")


class ProbeError(RuntimeError):
    """The child process failed, printed no row, or returned a row for another configuration."""


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples become lists), for comparing arguments with fields."""
    return json.loads(json.dumps(value))


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def row_from_json(row_type: type[Row], data: dict) -> Row:
    """A row of `row_type` from its JSON form (lists back to tuples); unknown keys raise."""
    names = {f.name for f in dataclasses.fields(row_type)}
    if set(data) != names:
        raise ProbeError(
            f"{row_type.__name__}: got fields {sorted(data)}, expected {sorted(names)}"
        )
    return row_type(**{k: _tuples(v) for k, v in data.items()})


def check_row(row: Any, kwargs: dict) -> None:
    """Every argument that names a field of the row must have come back unchanged."""
    fields = _plain(dataclasses.asdict(row))
    wrong = {k: (v, fields[k]) for k, v in _plain(kwargs).items() if k in fields and fields[k] != v}
    if wrong:
        shown = ", ".join(f"{k}: asked {a!r}, got {b!r}" for k, (a, b) in wrong.items())
        raise ProbeError(f"{type(row).__name__} answers another configuration ({shown})")


def _command(fn: Callable, kwargs: dict) -> list[str]:
    target = f"{fn.__module__}:{fn.__qualname__}"
    return [sys.executable, "-m", "r2ac.bench.probe", target, json.dumps(kwargs)]


def run_fresh_rows(fn: Callable[..., Any], row_type: type[Row], **kwargs) -> list[Row]:
    """Call fn(**kwargs) in a fresh Python process; its row, or list of rows, as `row_type`."""
    proc = subprocess.run(_command(fn, kwargs), capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip()[-500:]
        raise ProbeError(
            f"probe {fn.__qualname__}({kwargs}) failed (exit {proc.returncode}): {tail}"
        )
    payload = json.loads(lines[-1])
    rows = [
        row_from_json(row_type, d) for d in (payload if isinstance(payload, list) else [payload])
    ]
    for row in rows:
        check_row(row, kwargs)
    return rows


def run_fresh(fn: Callable[..., Any], row_type: type[Row], **kwargs) -> Row:
    """Call fn(**kwargs) in a fresh Python process; the one row it returns, as `row_type`."""
    rows = run_fresh_rows(fn, row_type, **kwargs)
    if len(rows) != 1:
        raise ProbeError(f"probe {fn.__qualname__} returned {len(rows)} rows, expected one")
    return rows[0]


def main(argv: list[str]) -> int:
    """The child: `python -m r2ac.bench.probe module:function '<json kwargs>'`."""
    module_name, _, name = argv[0].partition(":")
    fn = getattr(importlib.import_module(module_name), name)
    result = fn(**json.loads(argv[1]))
    rows = result if isinstance(result, list) else [result]
    payload = [dataclasses.asdict(r) for r in rows]
    print(json.dumps(payload if isinstance(result, list) else payload[0]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
