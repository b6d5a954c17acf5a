"""Files from elsewhere: a planted pickle never runs, a corrupted checkpoint is refused.

Every load of a checkpoint (train --resume, eval, copy --resume, --load-stem, the experiment
runner's resume) is weights-only and checksummed: a pickled callable is refused with one
line and exit code 2 before it can run, and so is a file with garbled bytes.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from r2ac.experiments import runner
from r2ac.experiments.grids import RunSpec, Task, Variant
from r2ac.rl.harness import train_cli
from r2ac.rl.run.run_dir import RunDir
from r2ac.rtrl.elstm.math import ELSTMSensitivity, ELSTMState
from r2ac.runs import checkpoint
from r2ac.runs.plain import to_numpy
from r2ac.tasks import copy_cli

from .conftest import error_lines, r2ac, r2ac_inline, subprocess_env, tiny_args


class _Payload:
    """Unpickling this writes `marker`: the attack a planted checkpoint carries."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def plant(path: Path, marker: Path) -> None:
    """A bare torch.save pickle whose loading would write `marker`."""
    torch.save({"agent": _Payload(marker), "learner": {}, "counters": {}}, path)


def plant_checksummed(path: Path, marker: Path) -> None:
    """The same payload in the checksummed format, with a correct digest."""
    buffer = io.BytesIO()
    torch.save({"agent": _Payload(marker)}, buffer)
    body = buffer.getvalue()
    header = checkpoint.MAGIC + f"sha256 {hashlib.sha256(body).hexdigest()} {len(body)}\n".encode()
    path.write_bytes(header + body)


def garble(path: Path, count: int = 8000) -> None:
    """Overwrite `count` bytes (at most a quarter of the file) in its middle; same size."""
    data = bytearray(path.read_bytes())
    count = min(count, len(data) // 4)
    start = len(data) // 2 - count // 2
    data[start : start + count] = bytes((i * 7 + 13) % 256 for i in range(count))
    path.write_bytes(bytes(data))


def test_planted_checkpoint_does_not_run_on_resume(run_copy, tmp_path, capsys):
    """In this process: the payload would write the marker here. The experiment runner's
    test below makes the same check on a real `r2ac train --resume` subprocess."""
    marker = tmp_path / "marker"
    plant(run_copy / "checkpoints" / "latest.pt", marker)
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    assert code == 2 and not marker.exists()
    assert len(lines) == 1 and "latest.pt" in lines[0] and "refused" in lines[0], lines


def test_planted_checksummed_checkpoint_does_not_run(run_copy, tmp_path, capsys):
    """A correct digest does not make a pickle safe: the body is still loaded weights-only."""
    marker = tmp_path / "marker"
    plant_checksummed(run_copy / "checkpoints" / "latest.pt", marker)
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    assert code == 2 and not marker.exists()
    assert len(lines) == 1 and "latest.pt" in lines[0] and "refused" in lines[0], lines


def test_planted_agent_does_not_run_on_eval(run_copy, tmp_path, capsys):
    marker = tmp_path / "marker"
    plant(run_copy / "checkpoints" / "agent.pt", marker)
    code, lines = r2ac_inline(capsys, "eval", str(run_copy))
    assert code == 2 and not marker.exists()
    assert len(lines) == 1 and "agent.pt" in lines[0] and "refused" in lines[0], lines
    assert not (run_copy / "eval.json").exists()


def test_planted_stem_does_not_run(tmp_path, capsys):
    marker, stem = tmp_path / "marker", tmp_path / "stem.pt"
    plant(stem, marker)
    argv = [*tiny_args(2), "--load-stem", str(stem), "--out-dir", str(tmp_path / "out")]
    assert train_cli.main(argv) == 2
    assert not marker.exists() and not (tmp_path / "out").exists()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "stem.pt" in lines[0], lines


def test_planted_copy_checkpoint_does_not_run(tmp_path, capsys):
    marker, out = tmp_path / "marker", tmp_path / "copy"
    out.mkdir()
    plant(out / "checkpoint.pt", marker)
    argv = ["--length", "2", "--hidden", "8", "--train-steps", "2", "--resume", "--out", str(out)]
    assert copy_cli.main(argv) == 2
    assert not marker.exists()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "checkpoint.pt" in lines[0] and "refused" in lines[0], lines


def test_experiment_runner_does_not_run_a_planted_checkpoint(finished_run, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])  # the runner's children
    task = Task("cue", "delayed-cue", {}, note="tiny")
    spec = RunSpec(task, Variant("elstm-rtrl", 4), 0)
    run_dir = tmp_path / "exp" / "runs" / spec.run_id
    shutil.copytree(finished_run, run_dir)
    (run_dir / "eval.json").unlink()
    marker = tmp_path / "marker"
    plant(run_dir / "checkpoints" / "latest.pt", marker)
    result = runner.run_one(spec, tmp_path / "exp", None)
    assert result.status == "failed" and "exit code 2" in result.message
    assert not marker.exists()
    log = (tmp_path / "exp" / "logs" / f"{spec.run_id}.log").read_text().splitlines()
    assert log[0].startswith("$ ") and "--resume" in log[0]  # the command, then its output
    assert len(log) == 2 and "latest.pt: refused" in log[1], log


def test_garbled_checkpoint_is_refused_on_resume(run_copy):
    garble(run_copy / "checkpoints" / "latest.pt")
    proc = r2ac("train", "--resume", str(run_copy))
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "latest.pt" in lines[0] and "checksum mismatch" in lines[0], lines


def test_garbled_weights_are_refused_by_eval(run_copy, capsys):
    garble(run_copy / "checkpoints" / "agent.pt")
    code, lines = r2ac_inline(capsys, "eval", str(run_copy))
    assert code == 2
    name = "agent.pt"
    assert len(lines) == 1 and name in lines[0] and "checksum mismatch" in lines[0], lines
    assert not (run_copy / "eval.json").exists()


def test_truncated_and_foreign_files_are_refused(run_copy, tmp_path):
    latest = run_copy / "checkpoints" / "latest.pt"
    data = latest.read_bytes()
    latest.write_bytes(data[: len(data) // 3])
    with pytest.raises(checkpoint.CheckpointError, match="truncated"):
        RunDir(run_copy).load_checkpoint()
    latest.write_bytes(b"hello, I am a text file\n" * 10)
    with pytest.raises(checkpoint.CheckpointError, match="not a checkpoint"):
        RunDir(run_copy).load_checkpoint()
    latest.write_bytes(checkpoint.MAGIC + b"sha256 nonsense\n")
    with pytest.raises(checkpoint.CheckpointError, match="damaged checkpoint header"):
        RunDir(run_copy).load_checkpoint()


def test_old_bare_checkpoints_load_through_the_converter(run_copy, capsys):
    """A bare torch.save of data (the old agent.pt) loads; one of the objects older versions
    pickled (numpy arrays, the core state's NamedTuple and sensitivity classes) is read with
    stand-ins for the names it holds, never the classes, and resumes; `convert` rewrites it
    in schema 2."""
    agent, latest = run_copy / "checkpoints" / "agent.pt", run_copy / "checkpoints" / "latest.pt"
    torch.save(checkpoint.load(agent), agent)  # the old format of agent.pt: a state_dict
    assert set(checkpoint.load(agent)["agent"]) == set(torch.load(agent)["agent"])
    payload = checkpoint.load(latest)
    older = copy.deepcopy(payload)
    older["rng"]["numpy"] = to_numpy(older["rng"]["numpy"])
    for actor in older["actors"]:
        c, (fz, wb) = actor["state"]["c"], actor["state"]["sens"]
        actor["state"] = ELSTMState(c, ELSTMSensitivity(fz, wb))
        actor["env"] = to_numpy(actor["env"])
    torch.save(older, latest)  # the old format of latest.pt: numpy arrays, NamedTuples
    assert b"ELSTMSensitivity" in latest.read_bytes()
    again = RunDir(run_copy).load_checkpoint()
    assert again["counters"] == payload["counters"]
    assert json.dumps(again["config"]) == json.dumps(payload["config"])
    for ours, theirs in zip(again["actors"], payload["actors"], strict=True):
        assert ours["state"]["c"].equal(theirs["state"]["c"])
        assert all(map(torch.equal, ours["state"]["sens"], theirs["state"]["sens"]))
        assert ours["env"]["t"].equal(theirs["env"]["t"])
    assert checkpoint.main(["convert", str(latest)]) == 0
    assert latest.read_bytes().startswith(checkpoint.MAGIC)
    assert checkpoint.load(latest)["counters"] == payload["counters"]
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    assert code == 0 and (run_copy / "eval.json").is_file(), lines
