"""SIGINT / SIGTERM: the update finishes, a checkpoint is written, one line, exit 128+signal;
`--resume` continues with no lost update, to the weights of an uninterrupted run. SIGKILL:
resume from the last checkpoint; metrics rows and TensorBoard scalars hold every update once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from r2ac.rl.run.run_dir import read_metrics
from r2ac.runs import checkpoint

from .conftest import (
    TIMEOUT_S,
    UPDATES,
    last_update,
    r2ac,
    r2ac_inline,
    start_r2ac,
    tiny_args,
)


def _args(out: Path, checkpoint_every: int = 1000) -> list[str]:
    return [
        "train",
        *tiny_args(UPDATES, checkpoint_every),
        "--no-eval-at-end",
        "--out-dir",
        str(out),
    ]


def _updates(run: Path) -> list[int]:
    return [int(r["update"]) for r in read_metrics(run / "metrics.csv")]


def _start_and_wait(command: list[str], out: Path, past: int, need_checkpoint: bool = False):
    """Start `r2ac COMMAND`; return once its metrics show an update after `past` (and a
    checkpoint exists if asked): a readiness signal instead of a blind sleep."""
    proc = start_r2ac(*command, detached=False)
    deadline = time.monotonic() + TIMEOUT_S
    ckpt = out / "checkpoints" / "latest.pt"
    while time.monotonic() < deadline and proc.poll() is None:
        if last_update(out) > past and (ckpt.exists() or not need_checkpoint):
            return proc
        time.sleep(0.005)
    proc.kill()
    pytest.fail(f"the run did not pass update {past} (rc {proc.poll()}): {proc.communicate()[1]}")


def _final_weights(run: Path) -> dict:
    return checkpoint.load(run / "checkpoints" / "agent.pt")["agent"]


def _tensorboard_steps(run: Path, tag: str = "loss") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_sigint_finishes_the_update_checkpoints_and_exits_130(tmp_path):
    out = tmp_path / "run"
    proc = _start_and_wait(_args(out), out, past=2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("r2ac train: stopped by SIGINT after update") and "--resume" in last
    stopped = checkpoint.load(out / "checkpoints" / "latest.pt")["counters"]["update"]
    assert 3 <= stopped < UPDATES and f"after update {stopped} of {UPDATES}" in last
    assert _updates(out) == list(range(1, stopped + 1))  # every update done is logged


def test_sigkill_resume_sigterm_resume_equals_an_uninterrupted_run(tmp_path, finished_run):
    """SIGKILL after the checkpoint at update 5 (rows after it already logged), resume,
    SIGTERM mid-way, resume to the end: the weights of a run never interrupted, and every
    update once in metrics.csv and in TensorBoard (whose steps are frame counts)."""
    out = tmp_path / "run"
    proc = _start_and_wait(_args(out, checkpoint_every=5), out, past=7, need_checkpoint=True)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT_S)
    killed_at = last_update(out)
    proc = _start_and_wait(["train", "--resume", str(out)], out, past=killed_at + 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("r2ac train: stopped by SIGTERM after update")
    stopped = checkpoint.load(out / "checkpoints" / "latest.pt")["counters"]["update"]
    assert killed_at < stopped < UPDATES and _updates(out) == list(range(1, stopped + 1))

    resumed = r2ac("train", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["update"]) for r in rows] == list(range(1, UPDATES + 1))
    assert _tensorboard_steps(out) == [24 * u for u in range(1, UPDATES + 1)]
    assert [int(r["frames"]) for r in rows] == [24 * u for u in range(1, UPDATES + 1)]
    final, reference = _final_weights(out), _final_weights(finished_run)
    assert final.keys() == reference.keys()
    assert all(final[k].equal(reference[k]) for k in final)  # bit-identical: no lost update
    assert not list((out / "checkpoints").glob(".*.tmp"))


def _group_ends(pgid: int, seconds: float = 20.0) -> bool:
    """Whether every process of the group exits within `seconds` (the resource tracker of
    multiprocessing leaves when it sees its parent gone, a moment later)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_parallel_ctrl_c_to_the_group_checkpoints_and_resumes(tmp_path):
    """Ctrl-C reaches the learner and its actor processes (one process group): the actors
    ignore it, the learner finishes its update, checkpoints, stops them and exits 130."""
    out = tmp_path / "run"
    args = [*_args(out), "--runtime", "parallel", "--num-actors", "2"]
    proc = start_r2ac(*args)
    deadline = time.monotonic() + TIMEOUT_S
    while last_update(out) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("r2ac train: stopped by SIGINT after update")
    assert _group_ends(proc.pid), "actor processes were left behind"
    stopped = checkpoint.load(out / "checkpoints" / "latest.pt")["counters"]["update"]
    assert _updates(out) == list(range(1, stopped + 1))
    resumed = r2ac("train", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert _updates(out) == list(range(1, UPDATES + 1))


def test_sigterm_during_the_final_evaluation_stops_at_once(tmp_path, capsys, monkeypatch):
    """After the last checkpoint a signal needs no update finished: one line, 143, and
    `--resume` redoes the evaluation."""
    from r2ac.rl.run import evaluation

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal should have stopped the evaluation")

    monkeypatch.setattr(evaluation, "evaluate", terminated)
    out = tmp_path / "run"
    code, lines = r2ac_inline(capsys, "train", *tiny_args(3), "--out-dir", str(out))
    assert code == 143 and lines[-1].startswith(
        "r2ac train: stopped by SIGTERM after update 3 of 3"
    )
    assert not (out / "eval.json").exists()
    monkeypatch.undo()
    assert r2ac_inline(capsys, "train", "--resume", str(out))[0] == 0
    assert (out / "eval.json").exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


def test_sigterm_while_the_runtime_closes_is_answered(tmp_path, capsys, monkeypatch):
    """The runtime closes inside the loop's guard (Ray's shutdown takes seconds): a SIGTERM
    there was recorded and forgotten (exit 0, no line); now it stops the run after its last
    checkpoint, one line, 143, and `--resume` redoes what was left (the evaluation)."""
    from r2ac.rl.runtimes import serial

    real_close = serial.SerialRuntime.close

    def close(self):
        os.kill(os.getpid(), signal.SIGTERM)
        real_close(self)

    monkeypatch.setattr(serial.SerialRuntime, "close", close)
    out = tmp_path / "run"
    code, lines = r2ac_inline(capsys, "train", *tiny_args(3), "--out-dir", str(out))
    assert code == 143 and lines[-1].startswith(
        "r2ac train: stopped by SIGTERM after update 3 of 3; checkpoint written"
    ), lines
    assert not (out / "eval.json").exists()
    monkeypatch.undo()
    assert r2ac_inline(capsys, "train", "--resume", str(out))[0] == 0
    assert (out / "eval.json").exists() and _updates(out) == [1, 2, 3]


def test_a_signal_a_command_swallowed_still_sets_its_exit_code(capsys, monkeypatch):
    """A library that catches the handler's exception (as Ray's shutdown may) and lets the
    command return 0: the command's exit is still 143, in one line."""
    from r2ac import cli

    def swallowing(argv):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            pass
        return 0

    monkeypatch.setattr(cli, "_dispatch", swallowing)
    assert cli._main(["train"]) == 143
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["r2ac train: stopped by SIGTERM as it ended (everything was written)"]
    monkeypatch.setattr(cli, "_dispatch", lambda argv: 0)
    assert cli._main(["train"]) == 0  # honoured once
