"""A run directory written before the modules moved (git 72d15e5: r2ac/rtrl/elstm_math.py,
r2ac/rl/checkpoint.py, a flat TrainConfig) still loads, evaluates and resumes.

tests/fixtures/run_72d15e5 is a tiny elstm-rtrl run made by that commit's `r2ac train`; its
latest.pt names the sensitivity classes by their old module (r2ac.rtrl.elstm_math).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from r2ac.rl.run.run_dir import RunDir
from r2ac.rtrl import ELSTMSensitivity, ELSTMState
from r2ac.runs import checkpoint

from .conftest import r2ac_inline

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_72d15e5"


def _states(tree):
    if isinstance(tree, ELSTMState):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _states(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _states(v)


def test_the_old_checkpoint_names_the_old_module():
    assert b"r2ac.rtrl.elstm_math:ELSTMState" in (FIXTURE / "checkpoints/latest.pt").read_bytes()


def test_an_old_training_checkpoint_decodes_to_the_moved_classes():
    payload = checkpoint.load(FIXTURE / "checkpoints" / "latest.pt")
    states = list(_states(payload))
    assert states, "the checkpoint holds the actor's core state"
    assert all(isinstance(s.sens, ELSTMSensitivity) for s in states)
    assert all(torch.isfinite(t).all() for s in states for t in s.sens.tensors())
    assert RunDir.open(FIXTURE).config().model.core == "elstm-rtrl"


def test_an_old_run_evaluates_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    (run / "eval.json").unlink()
    code, err = r2ac_inline(capsys, "eval", str(run), "--episodes", "2", "--sets", "1")
    assert code == 0, err
    code, err = r2ac_inline(capsys, "train", "--resume", str(run))
    assert code == 0, err
    assert json.loads((run / "eval.json").read_text())["episodes_per_set"] == 2
