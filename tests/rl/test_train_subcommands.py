"""`r2ac train impala | ppo | stream-ac | stream-q`: each subcommand lists the options its
algorithm reads and refuses the others in one line; no subcommand is IMPALA (or the preset's
algorithm)."""

from __future__ import annotations

import re

import pytest

from r2ac.errors import ConfigError
from r2ac.rl.config import validate
from r2ac.rl.harness.train_cli import parse_config
from r2ac.rl.harness.train_options import SUBCOMMANDS, check_flags


def _help_flags(capsys, algorithm: str) -> set[str]:
    """The distinct flags `r2ac train ALGORITHM --help` shows (--x and --no-x count once)."""
    with pytest.raises(SystemExit):
        parse_config([algorithm, "--help"])
    text = capsys.readouterr().out
    # an option's definition starts its line (a box's edge before it on a terminal)
    found = re.findall(r"^[│ ]*--([a-z][a-z0-9-]*)[ ,\n]", text, flags=re.M)
    return set(found) - {"help"}


@pytest.mark.parametrize("algorithm", ["stream-ac", "stream-q"])
def test_streaming_help_lists_at_most_35_options(capsys, algorithm):
    flags = _help_flags(capsys, algorithm)
    assert 20 <= len(flags) <= 35, sorted(flags)
    assert {"num-agents", "stream-mlp", "prev-action", "discount", "num-threads", "progress",
            "eval-at-end", "checkpoint-every", "eval-sets", "eval-episodes", "out-dir"} <= flags  # fmt: skip
    assert not {"streaming", "runtime", "unroll-length", "batch-size", "num-envs", "popart",
                "load-stem", "epochs", "algorithm"} & flags  # fmt: skip


def test_batched_help_lists_theirs(capsys):
    impala, ppo = _help_flags(capsys, "impala"), _help_flags(capsys, "ppo")
    assert {"unroll-length", "batch-size", "runtime", "popart-sigma-floor"} <= impala
    assert {"clip-coef", "gae-lambda", "targets"} <= ppo - impala
    assert not {"num-agents", "kappa-actor", "streaming", "algorithm"} & (impala | ppo)
    assert len(impala) > 35


def test_no_subcommand_is_impala_on_the_delayed_cue():
    cfg = validate(parse_config([]))
    assert cfg.loss.algorithm == "impala" and cfg.env.id == "builtin/delayed-cue"


def test_a_streaming_subcommand_runs_with_the_env_alone():
    cfg = validate(parse_config(["stream-ac", "--env", "builtin/memory-chain"]))
    assert cfg.loss.algorithm == "stream-ac" and cfg.streaming
    assert cfg.model.core == "rtu-rtrl" and cfg.stream.stream_mlp == (128, 128)


def test_a_preset_picks_its_algorithm_and_flags_keep_their_names():
    cfg = validate(parse_config(["--preset", "stream-q", "--num-agents", "3", "--stream-mlp"]))
    assert cfg.loss.algorithm == "stream-q" and cfg.stream.num_agents == 3
    assert cfg.stream.stream_mlp == ()
    cfg = validate(parse_config(["ppo", "--preset", "delayed-cue", "--clip-coef", "0.3"]))
    assert cfg.loss.algorithm == "ppo" and cfg.loss.clip_coef == 0.3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["stream-ac", "--epochs", "2"], "--epochs: not an option of `r2ac train stream-ac`"),
        (["impala", "--num-agents", "2"], "an option of stream-ac and stream-q"),
        (["impala", "--clip-coef", "0.1"], "an option of ppo"),
        (["stream-q", "--kappa-actor", "2"], "an option of stream-ac"),
        (["stream-ac", "--streaming", "ac"], "not an option of r2ac train"),
        (["stream-ac", "--preset", "popgym"], "a batched preset"),
    ],
)
def test_options_of_another_algorithm_are_one_line_errors(argv, words):
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_every_subcommand_accepts_its_own_flags():
    from r2ac.rl.harness.train_options import flags_of

    for algorithm in SUBCOMMANDS:
        check_flags(sorted(flags_of(algorithm)), algorithm)


def test_the_algorithm_flag_of_older_command_lines_names_the_subcommand():
    assert validate(parse_config(["--algorithm", "ppo", "--epochs", "2"])).loss.algorithm == "ppo"
    with pytest.raises(ConfigError, match="--algorithm ppo: give one of"):
        parse_config(["stream-ac", "--algorithm", "ppo"])
