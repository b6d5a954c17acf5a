"""Shared helpers of the reliability tests: real `r2ac` subprocesses on tiny runs.

Each subprocess imports this checkout's package (PYTHONPATH set to the repository root), so
the tests check the code under test, not an installed copy.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from r2ac.rl.run.run_dir import read_metrics
from r2ac.runs import checkpoint

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # generous: CI runs on a loaded 2-core machine

# A run of 4 x 6 frames per update, an update in a few milliseconds.
TINY = [
    "--env-options", "delay=3", "--hidden-size", "8", "--stem-features", "6", "--mlp-hidden", "8",
    "--unroll-length", "4", "--num-envs", "3", "--batch-size", "6",
    "--log-every", "1", "--num-threads", "1", "--no-progress",
    "--eval-sets", "1", "--eval-episodes", "3",
]  # fmt: skip


def write_body(raw, path: Path) -> Path:
    """A checksummed checkpoint file whose body is `raw` itself: the form of an older schema
    (schema 1 had no schema key), or a forged body with a valid digest."""
    buffer = io.BytesIO()
    torch.save(raw, buffer)
    body = buffer.getvalue()
    digest = hashlib.sha256(body).hexdigest()
    path.write_bytes(checkpoint.MAGIC + f"sha256 {digest} {len(body)}\n".encode() + body)
    return path


def tiny_args(updates: int, checkpoint_every: int = 5) -> list[str]:
    return [*TINY, "--total-frames", str(24 * updates), "--checkpoint-every", str(checkpoint_every)]


def last_update(run: Path) -> int:
    """The last whole metrics row's update in `run` (0 if none yet); the file may be mid-write."""
    path = run / "metrics.csv"
    rows = read_metrics(path) if path.exists() else []
    return int(rows[-1]["update"]) if rows else 0


def subprocess_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        "OMP_NUM_THREADS": "1",
        "R2AC_NATIVE": "0",
    }


def r2ac_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "r2ac.cli", *args]


def start_r2ac(*args: str, mark: str | None = None, detached: bool = True) -> subprocess.Popen:
    """`r2ac ARGS` in the background: stderr piped (text), stdout dropped; in a process group of its
    own by default (as a terminal's job: a failed test can kill all of it); with `mark`,
    R2AC_TEST_MARK=mark in its environment, which every process it starts inherits."""
    env = subprocess_env() if mark is None else {**subprocess_env(), "R2AC_TEST_MARK": mark}
    return subprocess.Popen(
        r2ac_command(*args),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=detached,
    )


def r2ac(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `r2ac ARGS` to completion; stdout and stderr captured as text."""
    return subprocess.run(
        r2ac_command(*args),
        env=subprocess_env(),
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


def r2ac_inline(capsys, *args: str) -> tuple[int, list[str]]:
    """`r2ac ARGS` in this process (no interpreter start-up): exit code, stderr lines."""
    from r2ac.cli import main

    capsys.readouterr()
    code = main(list(args))
    return code, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


UPDATES = 120  # ~20 ms each on a loaded 2-core machine: a signal lands mid-run


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny run (UPDATES updates, evaluated), never interrupted: copy it, do not
    modify it. The signal tests compare their final weights with its."""
    out = tmp_path_factory.mktemp("finished") / "run"
    proc = r2ac("train", *tiny_args(UPDATES), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture()
def run_copy(finished_run, tmp_path) -> Path:
    """A private copy of the finished run, with its eval.json removed (resumable)."""
    dst = tmp_path / "run"
    shutil.copytree(finished_run, dst)
    (dst / "eval.json").unlink()
    return dst
