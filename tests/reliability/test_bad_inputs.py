"""Every bad input is one line on stderr and exit code 2, before anything is written."""

from __future__ import annotations

import json

import pytest
import torch

from r2ac.rl.harness import resources
from r2ac.rl.runtimes import memory

from .conftest import r2ac_inline, tiny_args

BAD_TRAIN_OPTIONS = [
    (["--env-options", "delay=3.5"], "delay=3.5 (expected int)"),
    (["--env-options", "delay=abc"], "delay='abc' (expected int)"),
    (["--env-options", "delay=nan"], "must be finite"),
    (["--env-options", "num_cues=2.0"], "num_cues=2.0 (expected int)"),
    (["--learning-rate", "nan"], "learning_rate=nan (not finite)"),
    (["--unroll-length", "100000"], "unroll_length=100000 (must be at most 4,096)"),
    (["--env-options", "delay=1000000000"], "delay must be in [0, 100,000]"),
    (
        ["--env", "builtin/watermaze", "--env-options", "episode_steps=1000000000"],
        "episode_steps must be in [1, 100,000]",
    ),
    (["--grad-clip", "nan"], "grad_clip=nan (not finite)"),
    (["--entropy-cost", "nan"], "entropy_cost=nan (not finite)"),
    (["--forget-bias", "nan"], "forget_bias=nan (not finite)"),
    (["--discount", "inf"], "discount=inf (not finite)"),
    (["--seed=-1"], "seed=-1 (must be >= 0)"),
]


@pytest.mark.parametrize("options,expected", BAD_TRAIN_OPTIONS)
def test_bad_train_option_is_one_line_and_exit_2(tmp_path, capsys, options, expected):
    out = tmp_path / "out"
    # the bad option last: tyro keeps the last of a repeated flag
    code, lines = r2ac_inline(capsys, "train", *tiny_args(2), *options, "--out-dir", str(out))
    assert code == 2
    assert len(lines) == 1 and expected in lines[0], lines
    assert not out.exists()


def test_an_out_dir_under_a_file_is_refused_up_front(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "run"
    code, lines = r2ac_inline(capsys, "train", *tiny_args(2), "--out-dir", str(out))
    assert code == 2 and len(lines) == 1 and "is a file, not a folder" in lines[0], lines


@pytest.mark.parametrize("options,named,gib", [
    (["--env-options", "num_cues=1000000"], "--env-options", 8),
    (["--unroll-length", "4096"], "--unroll-length", 0.25),  # the longest segment accepted
])  # fmt: skip
def test_runs_that_do_not_fit_in_memory_are_refused(
    tmp_path, capsys, monkeypatch, options, named, gib
):
    """Runs that would not fit in the memory available, on the default preset."""
    monkeypatch.delenv("R2AC_SKIP_MEMORY_CHECK", raising=False)
    monkeypatch.setattr(resources, "available_bytes", lambda: int(gib * resources.GIB))
    out = tmp_path / "out"
    code, lines = r2ac_inline(capsys, "train", *options, "--no-progress", "--out-dir", str(out))
    assert code == 2 and len(lines) == 1, lines
    assert "GiB" in lines[0] and f"lower {named}" in lines[0], lines
    assert not out.exists()


def test_the_memory_estimate_counts_rtrl_sensitivities(tmp_path):
    """2*N*D floats per eLSTM stream (N = hidden, D = stem features + 1), 3 copies per stream."""
    from r2ac.rl.harness.train_cli import parse_config

    cfg = parse_config([*tiny_args(2), "--hidden-size", "256", "--stem-features", "127"])
    sizes = memory.measure(cfg)
    assert sizes.state_bytes >= 4 * 2 * 256 * 128
    parts = memory.estimate(cfg, sizes)
    assert parts["core states"][0] == 3 * cfg.runtime.batch_size * sizes.state_bytes
    assert resources.refusal(parts, 2**30) is None  # a tiny run fits in 1 GiB


def test_config_json_with_wrong_types_is_refused(run_copy, capsys):
    path = run_copy / "config.json"
    meta = json.loads(path.read_text())
    meta["config"]["model"]["hidden_size"] = "eight"
    path.write_text(json.dumps(meta))
    for args in (["train", "--resume", str(run_copy)], ["eval", str(run_copy)]):
        code, lines = r2ac_inline(capsys, *args)
        assert code == 2 and len(lines) == 1, lines
        assert "hidden_size='eight' (expected int)" in lines[0], lines


def test_other_commands_refuse_bad_values_up_front(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    under_file = str(tmp_path / "file" / "out.json")
    cases = [
        (["bench", "core", "--repeats", "0"], "--repeats >= 1"),
        (["bench", "core", "--json-out", under_file], "is a file, not a folder"),
        (["experiment", "memory-m", "--jobs", "0", "--out", str(tmp_path / "e")], "--jobs"),
        (["copy", "--out", str(tmp_path / "file" / "c")], "is a file, not a folder"),
        (["copy", "--clip", "nan", "--out", str(tmp_path / "c")], "--clip"),
    ]
    if not torch.cuda.is_available():
        cases.append((["copy", "--device", "cuda", "--out", str(tmp_path / "c")], "no CUDA"))
    for args, expected in cases:
        code, lines = r2ac_inline(capsys, *args)
        assert code == 2 and len(lines) == 1 and expected in lines[0], (args, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_eval_refuses_an_unwritable_out_before_evaluating(run_copy, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, lines = r2ac_inline(
        capsys, "eval", str(run_copy), "--out", str(tmp_path / "file" / "e.json")
    )
    assert code == 2 and len(lines) == 1 and "is a file, not a folder" in lines[0], lines
