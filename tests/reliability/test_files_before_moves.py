"""A run directory written before the modules moved (git 72d15e5: r2ac/rtrl/elstm_math.py,
r2ac/rl/checkpoint.py, a flat TrainConfig) still loads, evaluates and resumes.

tests/fixtures/run_72d15e5 is a tiny elstm-rtrl run made by that commit's `r2ac train`; its
latest.pt names the sensitivity classes by their old module (r2ac.rtrl.elstm_math): the
converter maps those names to plain data through its fixed table, importing nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from r2ac.rl.config import validate
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.runtimes.serial import SerialRuntime
from r2ac.rtrl import ELSTMSensitivity, ELSTMState
from r2ac.runs import checkpoint

from .conftest import r2ac_inline

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_72d15e5"


def test_the_old_checkpoint_names_the_old_module():
    assert b"r2ac.rtrl.elstm_math:ELSTMState" in (FIXTURE / "checkpoints/latest.pt").read_bytes()


def test_an_old_training_checkpoint_converts_to_plain_states_the_actor_rebuilds():
    """Read through the converter, the core state is plain data (a dict of its fields, the
    sensitivities a list); the actor rebuilds it with its own (moved) classes."""
    payload = checkpoint.load(FIXTURE / "checkpoints" / "latest.pt")
    saved = payload["actors"][0]["state"]
    assert set(saved) == {"c", "sens"} and len(saved["sens"]) == 2
    assert all(torch.isfinite(t).all() for t in saved["sens"])
    runtime = SerialRuntime(validate(RunDir.open(FIXTURE).config()))
    try:
        runtime.restore(payload, source=FIXTURE / "checkpoints" / "latest.pt")
        state = runtime.actors[0].state
    finally:
        runtime.close()
    assert type(state) is ELSTMState and type(state.sens) is ELSTMSensitivity
    assert all(a.equal(b) for a, b in zip(state.sens.tensors(), saved["sens"], strict=True))


def test_an_old_run_evaluates_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    (run / "eval.json").unlink()
    code, err = r2ac_inline(capsys, "eval", str(run), "--episodes", "2", "--sets", "1")
    assert code == 0, err
    code, err = r2ac_inline(capsys, "train", "--resume", str(run))
    assert code == 0, err
    assert json.loads((run / "eval.json").read_text())["episodes_per_set"] == 2
