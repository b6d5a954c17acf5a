"""`r2ac train --runtime ray` as a user runs it (subprocesses, each starting its own Ray):
Ctrl-C to the process group and (`-m slow`) SIGTERM finish the update, checkpoint, stop
every actor and leave no process of the run behind; `--resume` then finishes the run
(in-process resume: tests/rl/test_ray.py). Every process the run
started carries a marker in its environment (Ray hands the driver's environment to its
processes), which is how the tests find leftovers. Bad Ray options are one line, exit 2
(without Ray installed: tests/rl/test_device.py)."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from r2ac.rl.run.run_dir import read_metrics
from r2ac.runs import checkpoint

from .conftest import (
    TIMEOUT_S,
    last_update,
    r2ac_command,
    r2ac_inline,
    start_r2ac,
    subprocess_env,
    tiny_args,
)

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
UPDATES = 100  # a few ms each: a signal after update 5 lands mid-run


def _marked(mark: str) -> list[str]:
    """Processes whose environment holds R2AC_TEST_MARK=mark: 'pid command'."""
    found = []
    needle = f"R2AC_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                found.append(f"{entry.name} {cmd.decode(errors='replace')[:100]}")
        except OSError:  # gone, or not ours
            continue
    return found


def _none_left(mark: str, seconds: float = 20.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _start(args: list[str], out: Path, mark: str, past: int) -> subprocess.Popen:
    """`r2ac ARGS` in a process group of its own (as a terminal's foreground job); returns once
    metrics.csv shows an update after `past`."""
    proc = start_r2ac(*args, mark=mark)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if last_update(out) > past:
            return proc
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the run did not pass update {past} (rc {proc.poll()}): {proc.communicate()[1]}")


def _train_args(out: Path) -> list[str]:
    return [
        "train",
        *tiny_args(UPDATES, checkpoint_every=1000),
        "--runtime",
        "ray",
        "--num-actors",
        "2",
        "--no-eval-at-end",
        "--out-dir",
        str(out),
    ]


def _stopped_cleanly(proc: subprocess.Popen, out: Path, mark: str, name: str) -> int:
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 128 + signal.Signals[name], err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"r2ac train: stopped by {name} after update"), err
    stopped = checkpoint.load(out / "checkpoints" / "latest.pt")["counters"]["update"]
    assert 5 < stopped < UPDATES
    assert [int(r["update"]) for r in read_metrics(out / "metrics.csv")] == list(
        range(1, stopped + 1)
    )
    assert _none_left(mark) == []  # Ray's own processes and the actors are gone
    return stopped


@needs_ray
def test_ray_ctrl_c_checkpoints_and_leaves_no_process(tmp_path):
    out, mark = tmp_path / "run", uuid.uuid4().hex
    proc = _start(_train_args(out), out, mark, past=5)
    assert len(_marked(mark)) >= 4  # the learner, Ray's processes, two actors
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    _stopped_cleanly(proc, out, mark, "SIGINT")


@needs_ray
@pytest.mark.slow
def test_ray_sigterm_checkpoints_leaves_no_process_and_resumes(tmp_path):
    out, mark = tmp_path / "run", uuid.uuid4().hex
    proc = _start(_train_args(out), out, mark, past=5)
    proc.send_signal(signal.SIGTERM)  # `kill PID`: the learner only
    _stopped_cleanly(proc, out, mark, "SIGTERM")
    resumed = subprocess.run(
        r2ac_command("train", "--resume", str(out)),
        env={**subprocess_env(), "R2AC_TEST_MARK": mark},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["update"]) for r in rows] == list(range(1, UPDATES + 1))
    assert _none_left(mark) == []


def _popen(args: list[str], mark: str) -> subprocess.Popen:
    return start_r2ac(*args, mark=mark)


# Phases of Ray's start-up, by the processes of the run there are: `ray.init` has begun
# once a process other than the learner exists (the reaper, then Ray's own, tens of ms
# apart); the actors are being made once a Ray worker exists (`ray::IDLE` until its
# RayActor is built: an interpreter, torch, the env, seconds).
PHASES = {"ray.init": ("",), "actors": ("ray::IDLE", "ray::RayActor")}


def _ray_starting(proc: subprocess.Popen, mark: str, phase: str = "ray.init") -> None:
    """Returns once the run's start-up is in `phase` (PHASES)."""
    deadline, starts = time.monotonic() + TIMEOUT_S, PHASES[phase]
    while time.monotonic() < deadline and proc.poll() is None:
        others = [ln.split(" ", 1) for ln in _marked(mark) if int(ln.split()[0]) != proc.pid]
        if any(cmd.startswith(starts) for _, cmd in others):
            return
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"start-up never reached {phase} (rc {proc.poll()}): {proc.communicate()[1]}")


def _seconds_to_clean(mark: str, since: float, limit: float = 10.0) -> float:
    """Seconds from `since` until no process of the run is left; fails past `limit`."""
    left = _none_left(mark, seconds=limit - (time.monotonic() - since))
    assert left == [], f"left {limit:g} s after the signal: {left}"
    return time.monotonic() - since


def sigterm_in_start_up(tmp_path: Path, phase: str, span: float, rng: random.Random) -> str:
    """SIGTERM to the learner 0..span s into `phase` of Ray's start-up."""
    out, mark = tmp_path / uuid.uuid4().hex[:8], uuid.uuid4().hex
    proc = _popen(_train_args(out), mark)
    _ray_starting(proc, mark, phase)
    delay = rng.uniform(0.0, span)
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    said = f"SIGTERM {delay:.2f} s into {phase}: rc {proc.returncode}\n{err}"
    assert proc.returncode == 143 and "Traceback" not in err, said
    lines = [ln for ln in err.splitlines() if ln.startswith("r2ac train:")]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0], said
    return f"{said.splitlines()[0]}, clean after {_seconds_to_clean(mark, sent):.1f} s"


@needs_ray
@pytest.mark.parametrize("phase", list(PHASES))
def test_sigterm_during_ray_start_up_is_one_line_and_leaves_no_process(tmp_path, phase):
    """In `ray.init` Ray's handlers (sys.exit(15)) stay out; while the actors start, the
    bare KeyboardInterrupt `ray.get` makes of the CLI's Terminated is still SIGTERM: exit
    143, one line; the half-started Ray (agents included) is gone within 10 s. (`ray.init`
    takes 1.5-9 s on a loaded 2-core box, the actors seconds more.)"""
    sigterm_in_start_up(tmp_path, phase, 1.0, random.Random())


@needs_ray
@pytest.mark.slow
def test_sigterm_at_random_times_in_ray_start_up(tmp_path):
    for trial in range(8):
        sigterm_in_start_up(tmp_path, "ray.init", 12.0, random.Random(trial))


def sigkill_learner(tmp_path: Path, past: int) -> float:
    out, mark = tmp_path / uuid.uuid4().hex[:8], uuid.uuid4().hex
    proc = _start(_train_args(out), out, mark, past=past)
    running = _marked(mark)  # the learner, the reaper, GCS, raylet, agents, actors ...
    assert len(running) >= 6 and "ray::RayActor" in " ".join(running), running
    sent = time.monotonic()
    proc.kill()  # SIGKILL: no cleanup runs in the learner
    proc.communicate(timeout=TIMEOUT_S)
    return _seconds_to_clean(mark, sent)


@needs_ray
def test_a_sigkilled_learner_takes_every_ray_process_with_it(tmp_path):
    """Ray's agents, raylet, GCS and the actors (workers re-parented to 1 included) are gone
    within 10 s of a SIGKILL of the learner (they stayed 60-90 s before the reaper)."""
    sigkill_learner(tmp_path, past=5)


@needs_ray
@pytest.mark.slow
def test_a_sigkill_at_random_times_leaves_no_ray_process(tmp_path):
    """SIGKILL of the learner at a random time of its start-up or training."""
    rng = random.Random(38)
    for _ in range(5):
        out, mark = tmp_path / uuid.uuid4().hex[:8], uuid.uuid4().hex
        proc = _popen(_train_args(out), mark)
        _ray_starting(proc, mark)
        time.sleep(rng.uniform(0.0, 12.0))
        sent = time.monotonic()
        proc.kill()
        proc.communicate(timeout=TIMEOUT_S)
        _seconds_to_clean(mark, sent)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--runtime", "ray", "--ray-address", "ray://head:10001"], "give `auto` or HOST:PORT"),
        (["--ray-address", "auto"], "--ray-address needs --runtime ray"),
        pytest.param(
            ["--runtime", "ray", "--ray-address", "127.0.0.1:1"],
            "nothing answers there",
            marks=needs_ray,
        ),
    ],
)
def test_bad_ray_options_are_one_line(capsys, tmp_path, args, says):
    code, lines = r2ac_inline(capsys, "train", *args, "--out-dir", str(tmp_path / "run"))
    assert code == 2 and len(lines) == 1 and says in lines[0], lines


_SHUTDOWN_PROBE = """
import os, signal, sys, time, ray
from r2ac.rl.runtimes.ray import sigterm_stays_ours

def caught():
    mask = next(ln for ln in open("/proc/self/status") if ln.startswith("SigCgt")).split()[1]
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)

class Terminated(Exception):
    pass

def terminated(*args):
    raise Terminated

signal.signal(signal.SIGTERM, terminated)
if sys.argv[1] == "plain":  # Ray's failure handler in: set ours again after Ray's init
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    signal.signal(signal.SIGTERM, terminated)
else:
    with sigterm_stays_ours():
        ray.init(address="local", num_cpus=1, include_dashboard=False)
if sys.argv[2] == "during":  # a SIGTERM late in the shutdown: the core worker is gone,
    node = ray._private.worker._global_node  # Ray's processes are stopped next
    stop_processes = node.kill_all_processes

    def sigterm_first(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return stop_processes(*args, **kwargs)

    node.kill_all_processes = sigterm_first
try:
    ray.shutdown()
    time.sleep(0.5)
except Terminated:
    print("raised")
    os._exit(0)
print("caught" if caught() else "default")
"""


def _shutdown_probe(init: str, signal_when: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _SHUTDOWN_PROBE, init, signal_when],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return done.stdout.split()[-1] if done.returncode == 0 else f"rc {done.returncode}"


@needs_ray
def test_sigterm_stays_caught_through_ray_shutdown():
    """Ray's C++ failure-signal handler takes SIGTERM, and `ray.shutdown()` uninstalls it to
    the default action behind Python's back: a SIGTERM during or after the shutdown killed
    the process (-15, no line). The plain calls show it (the checks have teeth); started the
    runtime's way, SIGTERM is Python's throughout: after the shutdown it is still caught, and
    one late in the shutdown (where Ray has uninstalled its handler) raises the handler's
    exception."""
    plain = {when: _shutdown_probe("plain", when) for when in ("after", "during")}
    ours = {when: _shutdown_probe("ours", when) for when in ("after", "during")}
    assert plain == {"after": "default", "during": "rc -15"}, plain
    assert ours == {"after": "caught", "during": "raised"}, ours
