"""Ctrl-C / SIGTERM in `r2ac copy` and `r2ac experiment`: one line, exit 128+signal, a
checkpoint, and a re-run that resumes (copy: bit-identically). The signals are real ones,
sent to this process (`os.kill`) at a chosen point of the run."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from r2ac.experiments import cli, grids, runner
from r2ac.experiments.grids import Grid, RunSpec, Task, Variant
from r2ac.runs import checkpoint
from r2ac.runs import stop as stop_module
from r2ac.runs.stop import StopRequest
from r2ac.tasks import copy_cli
from r2ac.tasks.copy import curve, training

from .conftest import TIMEOUT_S, subprocess_env

COPY = [
    "--length", "3", "--hidden", "8", "--batch-size", "4", "--eval-every", "3",
    "--test-size", "20", "--no-stop-when-solved", "--threads", "1", "--train-steps", "10",
]  # fmt: skip


def test_a_repeated_sigterm_only_repeats_the_request_and_a_second_sigint_stops_now():
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # e.g. `timeout` signalling the whole group
        assert stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_signal_dropped_on_its_way_is_honoured_by_the_next_stop_request():
    """Python drops an exception raised in an at-fork callback ("Exception ignored"): a SIGTERM
    whose Terminated was lost so stops the next training loop at its first check; one that
    ended a command (its exit code taken) does not."""
    previous = stop_module.install_handlers()
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except stop_module.Terminated:
            pass  # dropped, as Python does in an at-fork callback
        with StopRequest() as stop:
            assert stop.requested and stop.signum == signal.SIGTERM
        with StopRequest() as stop:
            assert not stop.requested  # honoured once
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except stop_module.Terminated as exc:
            assert stop_module.exit_code(exc) == 143  # the command ends on it
        with StopRequest() as stop:
            assert not stop.requested
    finally:
        stop_module.restore_handlers(previous)


def _signal_at_batch(monkeypatch, batch: int, signum: int) -> None:
    """Send `signum` to this process right after training batch `batch`."""
    real, calls = training.update, []

    def update(*args):
        stats = real(*args)
        calls.append(1)
        if len(calls) == batch:
            os.kill(os.getpid(), signum)
        return stats

    monkeypatch.setattr(training, "update", update)


def _curve_without_seconds(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(out / "checkpoint.pt")["model"]


def test_copy_ctrl_c_checkpoints_and_resumes_bit_identically(tmp_path, capsys, monkeypatch):
    """SIGINT after batch 5 (evaluations at 3, 6, 9, 10): the batch finishes, a checkpoint at
    5 with the two batches since the evaluation at 3, one line, 130; curve.csv holds the rows
    the checkpoint holds; `--resume` ends with the weights and curve of an uninterrupted run."""
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert copy_cli.main([*COPY, "--out", str(straight)]) == 0
    with monkeypatch.context() as m:
        _signal_at_batch(m, 5, signal.SIGINT)
        capsys.readouterr()
        assert copy_cli.main([*COPY, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "r2ac copy: stopped by SIGINT after batch 5 of 10; checkpoint written; continue with "
        f"`r2ac copy {' '.join(COPY)} --out {out} --resume`"
    )
    saved = checkpoint.load(out / "checkpoint.pt")["progress"]
    assert saved["step"] == 5 and len(saved["window"]) == 2
    assert [r["step"] for r in curve.read_curve_csv(out / "curve.csv")] == [0, 3]
    assert [r["step"] for r in saved["curve"]] == [0, 3]
    assert not (out / "results.json").exists() and not list(out.glob(".*.tmp"))

    assert copy_cli.main([*COPY, "--out", str(out), "--resume"]) == 0
    resumed, reference = _weights(out), _weights(straight)
    assert resumed.keys() == reference.keys()
    assert all(resumed[k].equal(reference[k]) for k in resumed)
    rows = _curve_without_seconds(out / "curve.csv")
    assert [r["step"] for r in rows] == ["0", "3", "6", "9", "10"]
    assert rows == _curve_without_seconds(straight / "curve.csv")  # train_loss at 6 too
    same = ("bit_accuracy", "sequence_accuracy", "loss", "train_steps", "updates")
    results = [json.loads((d / "results.json").read_text()) for d in (out, straight)]
    assert [{k: r[k] for k in same} for r in results] == [{k: results[1][k] for k in same}] * 2


def test_copy_sigterm_after_the_last_checkpoint_stops_at_once(tmp_path, capsys, monkeypatch):
    """During the final writes (plot) a signal needs no batch finished: 143, no results.json;
    `--resume` redoes them."""

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal should have stopped the plot")

    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(curve, "plot_curves", terminated)
        capsys.readouterr()
        assert copy_cli.main([*COPY, "--out", str(out)]) == 143
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("r2ac copy: stopped by SIGTERM after batch 10 of 10; checkpoint")
    assert not (out / "results.json").exists()
    assert copy_cli.main([*COPY, "--out", str(out), "--resume"]) == 0
    assert json.loads((out / "results.json").read_text())["train_steps"] == 10
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


# A child that records the signal that stopped it (or that it started) in its marker file.
FAKE_CHILD = """
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    marker.write_text(signal.Signals(signum).name)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
marker.write_text("started")
time.sleep(60)
"""


def _signal_when(paths: list[Path], text: str, signum: int) -> threading.Thread:
    """A thread that sends `signum` to this process once every path holds `text`."""

    def wait_and_signal():
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if all(p.exists() and p.read_text() == text for p in paths):
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait_and_signal, daemon=True)
    thread.start()
    return thread


def test_grid_ctrl_c_stops_every_child_and_starts_no_more(tmp_path, monkeypatch):
    """Three runs, two at a time: SIGINT once two children run; each gets one SIGTERM, the
    third never starts, GridStopped carries the counts."""
    markers = {}

    def fake_command(spec, run_dir, total_frames):
        markers[spec.run_id] = tmp_path / f"{spec.run_id}.marker"
        return [sys.executable, "-c", FAKE_CHILD, str(markers[spec.run_id])]

    monkeypatch.setattr(runner, "command_for", fake_command)
    task = Task("cue", "delayed-cue", {}, note="tiny")
    specs = [RunSpec(task, Variant("elstm-rtrl", 4), seed) for seed in range(3)]
    first_two = [tmp_path / f"{s.run_id}.marker" for s in specs[:2]]
    thread = _signal_when(first_two, "started", signal.SIGINT)
    shown = []
    with pytest.raises(runner.GridStopped) as stopped:
        runner.run_grid(specs, tmp_path / "exp", jobs=2, on_result=shown.append)
    thread.join()
    assert stopped.value.exit_code == 130 and stopped.value.not_started == 1
    assert [r.status for r in stopped.value.results] == ["stopped", "stopped"]
    assert [p.read_text() for p in first_two] == ["SIGTERM", "SIGTERM"]
    assert list(markers) == [s.run_id for s in specs[:2]] and shown == []
    assert stopped.value.summary() == (
        "0 runs finished, 2 stopped (each at its last checkpoint), 0 failed, 1 not started"
    )


TINY_TASK = Task(
    "cue",
    "delayed-cue",
    {
        "env_options": ("delay=3",),
        "hidden_size": 8,
        "stem_features": 8,
        "mlp_hidden": (8,),
        "num_envs": 4,
        "batch_size": 4,
        "unroll_length": 4,
        "total_frames": 16 * 400,
        "eval_sets": 1,
        "eval_episodes": 2,
        "log_every": 1,
        "checkpoint_every": 5,
        "num_threads": 1,
    },
    note="tiny",
)
TINY = Grid("tiny", "a tiny grid", (TINY_TASK,), (Variant("elstm-rtrl", 4),), default_seeds=2)


@pytest.mark.slow
def test_experiment_ctrl_c_then_a_rerun_finishes_the_grid(tmp_path, capsys, monkeypatch):
    """Real `r2ac train` children: SIGINT once both have a checkpoint; each stops at its next
    update with a checkpoint, one line, 130; the same command again resumes both to the end."""
    monkeypatch.setitem(grids.GRIDS, "tiny", TINY)
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    out = tmp_path / "exp"
    specs = grids.runs_of(TINY, 2)
    ckpts = [out / "runs" / s.run_id / "checkpoints" / "latest.pt" for s in specs]
    stamps = [p.with_name("marker") for p in ckpts]

    def mark_once_checkpointed():
        deadline = time.monotonic() + TIMEOUT_S
        while not all(p.exists() for p in ckpts) and time.monotonic() < deadline:
            time.sleep(0.01)
        for p in stamps:
            p.write_text("go")

    threading.Thread(target=mark_once_checkpointed, daemon=True).start()
    thread = _signal_when(stamps, "go", signal.SIGINT)
    argv = ["tiny", "--jobs", "2", "--out", str(out)]
    capsys.readouterr()
    assert cli.main(argv) == 130
    thread.join()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("r2ac")]
    assert err == [
        "r2ac experiment: stopped by SIGINT: 0 runs finished, 2 stopped (each at its last "
        "checkpoint), 0 failed, 0 not started; re-run the same command to resume"
    ]
    for spec in specs:
        assert runner.run_state(out / "runs" / spec.run_id) == "interrupted"
        log = (out / "logs" / f"{spec.run_id}.log").read_text()
        assert "r2ac train: stopped by SIGTERM after update" in log and "Traceback" not in log
    assert cli.main(argv) == 0
    for spec in specs:
        assert runner.run_state(out / "runs" / spec.run_id) == "finished"
        commands = [
            ln
            for ln in (out / "logs" / f"{spec.run_id}.log").read_text().splitlines()
            if ln.startswith("$ ")
        ]
        assert len(commands) == 2 and commands[1].endswith(f"--resume {out / 'runs' / spec.run_id}")


def test_a_signal_python_cannot_raise_is_not_printed_but_answered(monkeypatch):
    """A SIGTERM whose exception Python cannot raise (here in a __del__, as in an at-fork
    callback while Ray forks) went to sys.unraisablehook, which printed "Exception ignored ...
    Traceback" (the 20-trial Ray test saw it once); now it stops there, and the next
    StopRequest answers it. Other unraisable exceptions still reach the hook."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)  # stands for the printing hook

    class ClosesLate:
        def __init__(self, fail: bool = False):
            self.fail = fail

        def __del__(self):
            if self.fail:
                raise ValueError("not a signal")
            os.kill(os.getpid(), signal.SIGTERM)

    previous = stop_module.install_handlers()
    try:
        obj = ClosesLate()
        del obj
        assert seen == []
        obj = ClosesLate(fail=True)
        del obj
        assert [type(u.exc_value) for u in seen] == [ValueError]
        with StopRequest() as stop:
            assert stop.signum == signal.SIGTERM
    finally:
        stop_module.restore_handlers(previous)
