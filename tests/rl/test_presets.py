"""Presets: their documented values are their values."""

from pathlib import Path

import pytest

from r2ac.rl.config import validate
from r2ac.rl.harness.train_cli import parse_config
from r2ac.rl.presets import PRESETS, preset_overrides, preset_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rl.md"


def flat(*argv: str) -> dict:
    """The flat config `r2ac train --preset popgym ARGV` runs."""
    return parse_config(["--preset", "popgym", *argv]).flat()


def test_docs_show_every_preset_as_defined():
    text = DOCS.read_text()
    start, end = text.index("<!-- preset-table -->\n"), text.index("<!-- /preset-table -->")
    shown = text[start + len("<!-- preset-table -->\n") : end].strip()
    assert shown == preset_table(), "docs/rl.md's preset table is stale: paste preset_table()"


def test_popgym_preset_is_the_measured_recipe():
    pinned = {
        "env": "gym/popgym-RepeatFirstEasy-v0",
        "env_options": (),
        "hidden_size": 128,
        "forget_bias": None,
        "freeze_stem": False,
        "unroll_length": 4,
        "total_frames": 1_000_000,
        "learning_rate": 1e-3,
        "lr_decay": True,
        "lr_warmup_updates": 0,
        "batch_size": 256,
        "grad_clip": 4.0,
        "optimizer": "adam",
        "adam_eps": 1e-6,
        "algorithm": "ppo",
        "epochs": 2,
        "minibatches": 4,
        "targets": "gae",
        "gae_lambda": 0.95,
        "clip_coef": 0.1,
        "reward_scale": 50.0,
        "prev_action": True,
        "entropy_cost": 0.01,
        "popart": True,
        "head_hidden": 128,
    }
    chosen = PRESETS["popgym"]
    assert {k: chosen.flat()[k] for k in pinned} == pinned


def test_defaults_are_task_neutral_and_the_delayed_cue_is_a_preset():
    """The delayed cue's tuning lives in its preset, not in TrainConfig's defaults."""
    assert preset_overrides("delayed-cue") == {
        "env_options": ("delay=64",),
        "forget_bias": 4.5,
        "freeze_stem": True,
        "learning_rate": 5e-3,
        "lr_decay": True,
        "entropy_cost": 0.003,
    }


def test_every_preset_is_valid():
    for name in PRESETS:
        validate(PRESETS[name])


@pytest.mark.parametrize("argv", [["--help"], ["--preset", "popgym", "--help"]])
def test_train_help_lists_every_preset_with_its_values(argv, capsys):
    with pytest.raises(SystemExit):
        parse_config(argv)
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())  # unwrapped, unboxed
    for name in (n for n in PRESETS if not PRESETS[n].streaming):  # the batched subcommand's
        values = ", ".join(f"{k}={v}" for k, v in preset_overrides(name).items())
        assert f" {name} {values}" in text, name
    chosen = PRESETS["popgym" if "popgym" in argv else "delayed-cue"]
    assert (
        f"Segment length M: steps per segment, TD horizon, update period, TBPTT span. (default: {chosen.runtime.unroll_length})"
        in text
    )


def test_stream_help_lists_the_streaming_presets(capsys):
    with pytest.raises(SystemExit):
        parse_config(["stream-ac", "--help"])
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert " stream env=builtin/memory-chain" in text and " stream-q " in text
    assert " popgym env=" not in text


def test_a_family_value_applies_to_its_family_under_the_flags():
    """`--preset popgym` gives lstm cores grad clip 0.5 (the tuning protocol's family value,
    presets.FAMILY_VALUES); a flag still wins, in both spellings; other families and other
    presets keep their values; `r2ac experiment` resolves its runs the same way."""
    from r2ac.experiments.runner import check_overrides
    from r2ac.rl.presets import FAMILY_VALUES

    assert FAMILY_VALUES["popgym"]["lstm"] == {"grad_clip": 0.5}
    assert FAMILY_VALUES["popgym"]["elstm"] == {
        "epochs": 4,
        "hidden_size": 256,
        "stem_norm": True,
        "entropy_floor": 0.8,
        "entropy_floor_cap": 0.6,
        "learning_rate": 2e-3,
        "lr_decay": False,
    }
    assert FAMILY_VALUES["popgym"]["elstm-rtrl"] == {"rtrl_start_correction": True}

    def clip(*argv):
        return parse_config(list(argv)).flat()["grad_clip"]

    assert clip("--preset", "popgym", "--core", "lstm-bptt") == 0.5
    assert clip("--preset", "popgym", "--core", "lstm-bptt", "--grad-clip", "2") == 2.0
    assert clip("--preset", "popgym", "--core", "lstm-bptt", "--grad-clip=3") == 3.0
    assert clip("--preset", "popgym", "--core", "gru-bptt") == PRESETS["popgym"].flat()["grad_clip"]
    assert clip("--preset", "popgym-impala", "--core", "lstm-bptt") == 40.0
    assert check_overrides("popgym", {"core": "lstm-bptt"}).flat()["grad_clip"] == 0.5
    assert (
        check_overrides("popgym", {"core": "lstm-bptt", "grad_clip": 1.0}).flat()["grad_clip"]
        == 1.0
    )
    assert check_overrides("popgym", {"core": "elstm-rtrl"}).flat()["grad_clip"] == 4.0

    def epochs(*argv):
        return parse_config(list(argv)).flat()["epochs"]

    assert epochs("--preset", "popgym", "--core", "elstm-rtrl") == 4
    assert epochs("--preset", "popgym", "--core", "elstm-bptt") == 4
    assert epochs("--preset", "popgym", "--core", "elstm-rtrl", "--epochs", "2") == 2
    assert epochs("--preset", "popgym", "--core", "felstm-rtrl") == 2
    assert epochs("--preset", "popgym", "--core", "gru-bptt") == 2
    assert check_overrides("popgym", {"core": "elstm-bptt"}).flat()["epochs"] == 4

    assert flat("--core", "elstm-rtrl")["rtrl_start_correction"] is True
    assert flat("--core", "elstm-bptt")["rtrl_start_correction"] is False
    assert (
        flat("--core", "elstm-rtrl", "--no-rtrl-start-correction")["rtrl_start_correction"] is False
    )
    assert flat("--core", "elstm-bptt", "--lr-decay")["lr_decay"] is True
    assert flat("--core", "elstm-bptt")["lr_decay"] is False
    assert flat("--core", "gru-bptt")["lr_decay"] is True
    # GAE lambda stays 0.95 for the eLSTM (0.8 lowered MultiarmedBandit: docs/results.md)
    assert flat("--core", "elstm-bptt")["gae_lambda"] == 0.95
    assert flat("--core", "elstm-rtrl")["gae_lambda"] == 0.95
    assert flat("--core", "elstm-rtrl", "--gae-lambda", "0.8")["gae_lambda"] == 0.8


def test_a_core_value_beats_its_familys_and_a_bool_yields_to_either_spelling(monkeypatch):
    """FAMILY_VALUES may name a core ("elstm-rtrl") beside its family ("elstm"): the core's
    value wins for that core only; a bool value yields to its flag and to --no-FLAG."""
    from r2ac.experiments.runner import check_overrides
    from r2ac.rl import presets

    values = {"elstm": {"epochs": 4, "stem_norm": True}, "elstm-rtrl": {"epochs": 3}}
    monkeypatch.setitem(presets.FAMILY_VALUES, "popgym", values)

    assert flat("--core", "elstm-rtrl")["epochs"] == 3
    assert flat("--core", "elstm-bptt")["epochs"] == 4
    assert flat("--core", "elstm-rtrl", "--epochs", "5")["epochs"] == 5
    assert flat("--core", "elstm-bptt")["stem_norm"] is True
    assert flat("--core", "elstm-bptt", "--no-stem-norm")["stem_norm"] is False
    assert flat("--core", "gru-bptt")["stem_norm"] is False
    assert check_overrides("popgym", {"core": "elstm-rtrl"}).flat()["epochs"] == 3
    assert "elstm cores: `epochs=4`, `stem_norm=True`; elstm-rtrl: `epochs=3`" in preset_table()
