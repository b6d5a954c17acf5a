"""`r2ac train --preset popgym` and `r2ac eval` on every non-Discrete action space the issue
names: a few PPO updates (a tiny --total-frames), then greedy (the mode) and sampled
evaluation of the saved weights (the Box agent's log-std among them)."""

from __future__ import annotations

import json
import math

import pytest

from r2ac.rl.harness import evaluate, train_cli

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
pytest.importorskip("gymnasium")

ENVS = [
    "gym/Pendulum-v1",  # Box(1)
    "gym/popgym-PositionOnlyPendulumEasy-v0",  # Box(1), 2-dim observations
    "gym/popgym-BattleshipEasy-v0",  # MultiDiscrete([8 8])
    "gym/popgym-MineSweeperEasy-v0",  # MultiDiscrete([4 4])
]
FEW = ["--total-frames", "768", "--batch-size", "64", "--hidden-size", "16", "--log-every", "1"]
FEW += ["--no-progress"]


@pytest.mark.parametrize("env", ENVS)
def test_train_and_evaluate(env, tmp_path):
    if "popgym" in env:
        pytest.importorskip("popgym")
    out = tmp_path / "run"
    args = ["--preset", "popgym", "--env", env, *FEW, "--eval-sets", "1", "--eval-episodes", "2"]
    assert train_cli.main([*args, "--out-dir", str(out)]) == 0
    greedy = json.loads((out / "eval.json").read_text())
    assert greedy["actions"] == "greedy" and math.isfinite(greedy["mean"])
    metrics = (out / "metrics.csv").read_text().splitlines()
    assert len(metrics) >= 4  # a header and 3 updates (768 frames of 64 x 4)
    assert evaluate.main([str(out), "--sets", "1", "--episodes", "2", "--sampled"]) == 0
    sampled = json.loads((out / "eval.json").read_text())
    assert sampled["actions"] == "sampled" and len(sampled["returns"][0]) == 2
