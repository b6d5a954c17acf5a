"""A signal during set-up stops the command at once, in one line, and leaves the run as it was.

`r2ac train --resume` of a parallel run takes seconds before its first update (the actors'
processes import torch, build their envs and send their first segments). SIGTERM / SIGINT in
that time: exit 143 / 130 within seconds, one `r2ac train: stopped by ...` line, no traceback,
and the run directory's last checkpoint and metrics.csv byte for byte as before (nothing was
trained since the checkpoint, so nothing is written: the resumed run goes on from it).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from r2ac.runs import checkpoint, stop

from .conftest import TIMEOUT_S, r2ac, start_r2ac, tiny_args
from .test_signals import _group_ends

# the stop comes this soon after the signal (the actors take ~2-6 s to start on a loaded
# 2-core machine; before, a signal there waited for them, the first update and its checkpoint)
PROMPT_S = 4.0


def _stopped_run(tmp_path: Path) -> Path:
    """A parallel run stopped by SIGTERM after its checkpoint at update 4 (resumable)."""
    out = tmp_path / "run"
    args = [*tiny_args(10_000, checkpoint_every=4), "--runtime", "parallel", "--num-actors", "2"]
    proc = start_r2ac("train", *args, "--no-eval-at-end", "--out-dir", str(out))
    latest = out / "checkpoints" / "latest.pt"
    deadline = time.monotonic() + TIMEOUT_S
    while not latest.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 143 and latest.exists(), err
    return out


def _files(run: Path) -> dict[str, bytes]:
    return {
        name: (run / name).read_bytes()
        for name in ("checkpoints/latest.pt", "metrics.csv", "config.json")
    }


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_resumed_run_sets_up_stops_at_once(tmp_path, signum):
    run = _stopped_run(tmp_path)
    before = _files(run)
    update = checkpoint.load(run / "checkpoints" / "latest.pt")["counters"]["update"]
    proc = start_r2ac("train", "--resume", str(run))
    lines = []
    for line in proc.stderr:  # the run directory is open and locked: set-up goes on from here
        lines.append(line)
        if line.startswith("run directory:"):
            break
    time.sleep(random.uniform(0.0, 0.5))
    sent = time.monotonic()
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)  # Ctrl-C at a terminal: the actors get it too
    else:
        os.kill(proc.pid, signum)
    try:
        rest = proc.stderr.read()
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took, err = time.monotonic() - sent, "".join(lines) + rest
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and "Error" not in err, err
    said = [ln for ln in err.splitlines() if ln.startswith("r2ac train:")]
    assert len(said) == 1 and said[0].startswith(f"r2ac train: stopped by {signum.name};"), err
    assert f"`r2ac train --resume {run}`" in said[0], err
    assert took < PROMPT_S, f"{took:.1f} s\n{err}"
    assert _files(run) == before  # the last checkpoint (update 4 or so) is the run's still
    assert checkpoint.load(run / "checkpoints" / "latest.pt")["counters"]["update"] == update
    assert _group_ends(proc.pid)  # no actor left behind


def test_a_signal_while_a_parallel_run_starts_leaves_no_checkpoint_and_can_restart(tmp_path):
    """A new run: stopped before its first update, no checkpoint; `--restart` starts it."""
    out = tmp_path / "run"
    args = [*tiny_args(6, checkpoint_every=3), "--runtime", "parallel", "--num-actors", "2"]
    proc = start_r2ac("train", *args, "--no-eval-at-end", "--out-dir", str(out))
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("run directory:"):
            break
    os.kill(proc.pid, signal.SIGTERM)
    err = "".join(lines) + proc.stderr.read()
    proc.wait(timeout=TIMEOUT_S)
    assert proc.returncode == 143 and "Traceback" not in err, err
    said = [ln for ln in err.splitlines() if ln.startswith("r2ac train:")]
    assert len(said) == 1 and "no checkpoint yet" in said[0] and "--restart" in said[0], err
    assert not (out / "checkpoints" / "latest.pt").exists()
    assert _group_ends(proc.pid)
    restarted = r2ac("train", "--restart", str(out))
    assert restarted.returncode == 0, restarted.stderr
    assert checkpoint.load(out / "checkpoints" / "latest.pt")["counters"]["update"] == 6


def test_stop_request_at_once_raises_and_a_recorded_signal_is_raised_on_entry():
    """In-process: `stop_at_once` raises a signal recorded before it; while `at_once`, a
    signal raises Terminated; after it, a signal is only recorded; `signals_deferred` holds
    one back until its end, then hands it to the handler in place."""
    with stop.StopRequest() as request:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert request.requested
        with pytest.raises(stop.Terminated) as caught:
            request.stop_at_once()
    assert stop.exit_code(caught.value) == 143  # what the command does with it
    with stop.StopRequest() as request:
        request.stop_at_once()
        with pytest.raises(stop.Terminated) as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)
        assert stop.exit_code(caught.value) == 143
        assert request.signum == signal.SIGTERM  # kept, should a library swallow the raise
    with stop.StopRequest() as request:
        with stop.signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            assert not request.requested  # held back inside
        time.sleep(0.01)
        assert request.signum == signal.SIGTERM  # then recorded by the guard outside
    stop.take_unhonoured()
