"""The parallel runtime's faults, as subprocess tests of `r2ac train --runtime parallel`:
a SIGKILLed actor is restarted (or the run stops with one line naming it), a SIGKILLed
learner takes its actors with it and leaves nothing in /dev/shm, and Ctrl-C / SIGTERM
finish the update, checkpoint and exit 130 / 143 in every trial, never hanging."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from r2ac.rl.run.run_dir import read_metrics
from r2ac.runs import checkpoint

from .conftest import TIMEOUT_S, last_update, start_r2ac, tiny_args

SHM = Path("/dev/shm")
EXIT_S = 10.0  # how long the processes of a stopped run may take to be gone


def _args(out: Path, updates: int = 400, *extra: str) -> list[str]:
    return [
        "train",
        *tiny_args(updates, checkpoint_every=1000),
        "--no-eval-at-end",
        "--runtime",
        "parallel",
        "--num-actors",
        "2",
        "--out-dir",
        str(out),
        *extra,
    ]


def _start(args: list[str]) -> subprocess.Popen:
    return start_r2ac(*args)  # its own process group: a failed test can kill all of it


def _wait_for_update(proc: subprocess.Popen, out: Path, past: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while last_update(out) <= past:
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_all(proc)
            pytest.fail(f"the run did not pass update {past}: {proc.communicate()[1]}")
        time.sleep(0.005)


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the actors and multiprocessing's resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _actors(pid: int) -> list[int]:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        actors = [
            c for c in _children(pid) if b"spawn_main" in _cmdline(c) and _state(c) not in "ZX"
        ]
        if len(actors) == 2:
            return actors
        time.sleep(0.01)
    pytest.fail(f"learner {pid} has no two actor processes")


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _state(pid: int) -> str:
    """One letter from /proc/PID/stat ('Z' zombie, 'X' dead); 'X' if it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def _all_gone(pids: list[int], seconds: float = EXIT_S) -> list[int]:
    """The pids still running (not gone, not a zombie) after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _state(p) not in "ZX"]
        if not alive:
            return []
        time.sleep(0.02)
    return alive


def _kill_all(proc: subprocess.Popen) -> None:
    """Kill a run under test and whatever it started (for failing tests only)."""
    for pid in _children(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()


def _finish(proc: subprocess.Popen, seen: set[int] | None = None) -> tuple[int, str]:
    """Wait for the run to exit (a hang fails the test); add every child process it had
    meanwhile to `seen`."""
    deadline = time.monotonic() + TIMEOUT_S
    while proc.poll() is None:
        if seen is not None:
            seen.update(_children(proc.pid))
        if time.monotonic() > deadline:
            _kill_all(proc)
            pytest.fail(f"the run hung: {proc.communicate()[1]}")
        time.sleep(0.02)
    return proc.returncode, proc.communicate()[1]


def _wait_for_file(proc: subprocess.Popen, path: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_all(proc)
            pytest.fail(f"no {path.name}: {proc.communicate()[1]}")
        time.sleep(0.005)


@pytest.mark.parametrize("carry", ["actor", "learner"])
def test_a_sigkilled_actor_is_restarted_and_counted(tmp_path, carry):
    """With the learner's carry too: the restarted actor's streams begin at seq 1, so the
    learner starts them from zero sensitivities without a gap."""
    out = tmp_path / "run"
    proc = _start(_args(out, 40, "--sensitivity-carry", carry))
    _wait_for_update(proc, out, 3)
    os.kill(_actors(proc.pid)[0], signal.SIGKILL)
    code, err = _finish(proc)
    assert code == 0, err
    assert "killed by SIGKILL); restarting it (1 of 3)" in err and "Traceback" not in err
    assert "learner carry:" not in err  # no gap warning
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["update"]) for r in rows] == list(range(1, 41))
    assert rows[-1]["actor_restarts"] >= 1 and rows[0]["actor_restarts"] == 0


def test_a_sigkilled_actor_past_its_restarts_stops_the_run_with_one_line(tmp_path):
    out = tmp_path / "run"
    proc = _start(_args(out, 400, "--max-actor-restarts", "0"))
    _wait_for_update(proc, out, 3)
    victim = _actors(proc.pid)[1]
    os.kill(victim, signal.SIGKILL)
    code, err = _finish(proc)
    assert code == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith("r2ac train: error: actor ")
        and f"(pid {victim}) died (killed by SIGKILL)" in last
    )
    assert "max_actor_restarts=0" in last and f"--resume {out}" in last
    saved = checkpoint.load(out / "checkpoints" / "latest.pt")["counters"]["update"]
    assert 3 < saved < 400 and last_update(out) == saved
    assert _all_gone(_children(proc.pid)) == []


def _mp_temp_dirs() -> set[str]:
    """multiprocessing's own temp dirs (`pymp-*` in the temp dir; removed only at a clean exit)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("pymp-*")}


def test_a_sigkilled_learner_takes_its_actors_and_leaves_nothing_in_dev_shm(tmp_path):
    before, before_tmp = set(os.listdir(SHM)), _mp_temp_dirs()
    out = tmp_path / "run"
    proc = _start(_args(out))
    _wait_for_update(proc, out, 3)
    children = _children(proc.pid)  # two actors and the resource tracker
    assert len(children) >= 2
    proc.kill()
    proc.communicate(timeout=TIMEOUT_S)
    assert _all_gone(children, seconds=5.0) == []
    assert set(os.listdir(SHM)) - before == set()
    assert _mp_temp_dirs() - before_tmp == set()


def _stop_trial(tmp_path: Path, trial: int, signum: int, times: int = 1) -> None:
    """Start a run, signal the learner at a random point: while it starts its actors
    (before update 1) or in an update after update 1..3. Expect: the update finished, a
    checkpoint of it, one line, exit 128 + signal, no process left, no hang; before update 1
    was done, a stop at once (one line, no checkpoint) instead."""
    rng = random.Random(trial)
    out = tmp_path / f"run{trial}"
    proc = _start(_args(out))
    past = trial % 4 - 1  # the trials cycle through the start-up and updates 1..3
    if past < 0:  # the run directory exists: the runtime is starting its actors
        _wait_for_file(proc, out / "config.json")
        time.sleep(rng.uniform(0.0, 1.5))
    else:
        _wait_for_update(proc, out, past)
        time.sleep(rng.uniform(0.0, 0.03))  # anywhere in the next update
    children = set(_children(proc.pid))
    for _ in range(times):
        proc.send_signal(signum)
    code, err = _finish(proc, children)
    assert code == 128 + signum and "Traceback" not in err, err
    name = signal.Signals(signum).name
    last = err.strip().splitlines()[-1]
    if past < 0 and last.startswith(f"r2ac train: stopped by {name}; no checkpoint yet"):
        # before update 1 was done (the actors starting): stopped at once, nothing written
        assert "--restart" in last and not (out / "checkpoints" / "latest.pt").exists()
        assert len(children) >= 1 and _all_gone(list(children)) == []
        return
    assert last.startswith(f"r2ac train: stopped by {name} after update"), err
    stopped = checkpoint.load(out / "checkpoints" / "latest.pt")["counters"]["update"]
    assert f"after update {stopped} of" in last and stopped > max(past, 0)
    assert [int(r["update"]) for r in read_metrics(out / "metrics.csv")] == list(
        range(1, stopped + 1)
    )
    assert len(children) >= 2 and _all_gone(list(children)) == []


def test_ctrl_c_finishes_the_update_checkpoints_and_exits_130(tmp_path):
    _stop_trial(tmp_path, 0, signal.SIGINT)


def test_sigterm_twice_finishes_the_update_checkpoints_and_exits_143(tmp_path):
    _stop_trial(tmp_path, 3, signal.SIGTERM, times=2)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(20))
def test_ctrl_c_in_20_trials(tmp_path, trial):
    _stop_trial(tmp_path, 100 + trial, signal.SIGINT)
