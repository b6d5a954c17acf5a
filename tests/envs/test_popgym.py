"""POPGym through the gym adapter: options, ids, oracles, and the env-options leak."""

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.envs.scripted import evaluate, popgym_oracle_policy, random_policy
from r2ac.errors import ConfigError

pytest.importorskip("popgym")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("game", ["RepeatFirst", "RepeatPrevious", "CountRecall", "Autoencode"])
def test_oracles_reach_the_optimum_and_random_does_not(game):
    env = make(f"gym/popgym-{game}Easy-v0", 4, seed=0)
    mean, err = evaluate(env, popgym_oracle_policy(env), 3, seed=1)
    assert mean == pytest.approx(1.0, abs=1e-6) and err == pytest.approx(0.0, abs=1e-6)
    env = make(f"gym/popgym-{game}Easy-v0", 4, seed=0)
    mean, _ = evaluate(env, random_policy(env.num_actions, 0), 3, seed=1)
    assert mean < 0.0


def test_unknown_option_and_unknown_id_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"does not take env options \['delay'\]"):
        make("gym/popgym-RepeatFirstEasy-v0", 2, seed=0, delay=64)
    with pytest.raises(ConfigError, match="did you mean popgym-RepeatFirstEasy-v0"):
        make("gym/popgym-RepeatFirstEsy-v0", 2, seed=0)


def test_env_ids_are_listed(capsys):
    from r2ac.envs.cli import main

    assert main(["--ids"]) == 0
    out = capsys.readouterr().out
    assert "gym/popgym-RepeatFirstEasy-v0" in out and "gym/popgym-AutoencodeHard-v0" in out
    assert len([line for line in out.splitlines() if "gym/popgym-" in line]) >= 40


def test_preset_env_options_never_leak_into_another_env():
    from r2ac.rl.harness.train_cli import parse_config

    cfg = parse_config(["--env", "gym/popgym-RepeatFirstEasy-v0"])
    assert cfg.env.options == ()  # the delayed cue's delay=64 stays with the delayed cue
    assert parse_config([]).env.options == ("delay=64",)
    cfg = parse_config(["--env", "builtin/delayed-cue", "--env-options", "delay=5"])
    assert cfg.env.options == ("delay=5",)


def test_popgym_preset_trains_end_to_end(tmp_path):
    """A few updates of the preset on RepeatPrevious: the agent takes the previous action
    and the run writes its metrics (exit 0)."""
    from r2ac.rl.harness.train_cli import main

    out = tmp_path / "run"
    rc = main(
        [
            "--preset",
            "popgym",
            "--env",
            "gym/popgym-RepeatPreviousEasy-v0",
            "--total-frames",
            "2048",
            "--num-envs",
            "8",
            "--batch-size",
            "8",
            "--eval-sets",
            "1",
            "--eval-episodes",
            "2",
            "--no-progress",
            "--out-dir",
            str(out),
        ]
    )
    assert rc == 0
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) >= 2 and np.isfinite(float(rows[-1].split(",")[4]))


@pytest.mark.parametrize("game", ["Battleship", "MineSweeper", "PositionOnlyPendulum"])
def test_random_policy_plays_every_action_space(game):
    """MultiDiscrete cells and Box torques: the reference scores of the new families."""
    env = make(f"gym/popgym-{game}Easy-v0", 2, seed=0)
    mean, _ = evaluate(env, random_policy(env.action_space, 0), 1, seed=1)
    assert -1.0 <= mean <= 1.0
