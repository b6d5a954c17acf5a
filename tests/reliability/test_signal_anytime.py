"""A signal at any time, from the first line of `main` to the exit, ends in one line.

Each trial starts a tiny `r2ac train` (start-up, training, the final evaluation, exit), waits
until the process has caught SIGTERM (its handler, installed by the first line of
`r2ac.cli.main`, shows in /proc/PID/status), then sends SIGINT to its process group (Ctrl-C
at a terminal) or SIGTERM to it (a service manager) at a random time up to past the run's
end. Every trial: no traceback; exit 130 / 143 with one `r2ac train:` line, or 0 when the run
had finished and written eval.json; no process of the run left 10 s later. The default
suite runs a few trials per runtime; `-m slow` runs 20 for serial, parallel and ray.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import time
import uuid
from pathlib import Path

import pytest

from .conftest import TIMEOUT_S, start_r2ac, tiny_args
from .test_ray_runtime import _none_left

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
# the signal lands up to this long after the handler is in (a trial's run takes ~2-4 s)
SPAN_S = {"serial": 4.0, "parallel": 6.0, "ray": 25.0}


def handler_installed(pid: int) -> bool:
    """Whether `pid` catches SIGTERM (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(ln for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def trial(tmp_path: Path, runtime: str, rng: random.Random) -> str:
    """One run signalled at a random time; returns what happened, for the failure message."""
    out, mark = tmp_path / uuid.uuid4().hex[:8], uuid.uuid4().hex
    extra = [] if runtime == "serial" else ["--runtime", runtime, "--num-actors", "2"]
    args = ["train", *tiny_args(20, checkpoint_every=1000), *extra, "--out-dir", str(out)]
    proc = start_r2ac(*args, mark=mark)
    while not handler_installed(proc.pid) and proc.poll() is None:
        time.sleep(0.001)
    delay = rng.uniform(0, SPAN_S[runtime])
    time.sleep(delay)
    signum = rng.choice([signal.SIGINT, signal.SIGTERM])
    try:
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
    except ProcessLookupError:
        pass  # finished already
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = f"{signum.name} after {delay:.2f} s: rc {proc.returncode}\n{err}"
    assert "Traceback" not in err, said
    if proc.returncode == 0:
        assert (out / "eval.json").is_file(), said  # finished and written everything
    else:
        assert proc.returncode == 128 + signum, said
        lines = [ln for ln in err.splitlines() if ln.startswith("r2ac train:")]
        assert len(lines) == 1 and f"stopped by {signum.name}" in lines[0], said
    assert _none_left(mark, seconds=10.0) == [], said
    return said.splitlines()[0]


def trials(tmp_path: Path, runtime: str, count: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(count):
        trial(tmp_path, runtime, rng)


@pytest.mark.parametrize("runtime, count", [("serial", 4), ("parallel", 2)])
def test_a_signal_at_a_random_time_ends_in_one_line(tmp_path, runtime, count):
    trials(tmp_path, runtime, count, seed=int(time.time()))


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["serial", "parallel", pytest.param("ray", marks=needs_ray)])
def test_twenty_signals_at_random_times(tmp_path, runtime):
    trials(tmp_path, runtime, 20, seed=38)
