"""`r2ac train` / `r2ac eval`: bad input exits 2 and writes nothing; eval.json fields."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import validate
from r2ac.rl.harness import evaluate, train_cli
from r2ac.rl.learning.learner import RMS_ALPHA, RMS_EPS
from r2ac.rl.presets import PRESETS
from r2ac.runs import checkpoint
from r2ac.runs.locked_dir import machine_changes

from .rl_helpers import tiny

TINY_ARGS = [
    "--env-options",
    "delay=3",
    "--hidden-size",
    "8",
    "--stem-features",
    "6",
    "--mlp-hidden",
    "8",
    "--unroll-length",
    "4",
    "--num-envs",
    "3",
    "--batch-size",
    "3",
    "--total-frames",
    "48",
    "--eval-sets",
    "2",
    "--eval-episodes",
    "5",
    "--no-progress",
]


@pytest.mark.parametrize(
    "args",
    [
        ["--env", "builtin/nope"],
        ["--env", "nofamily/x"],
        ["--core", "elstm-sideways"],
        ["--core", "gru-rtrl"],
        ["--hidden-size", "0"],
        ["--unroll-length", "-3"],
        ["--num-envs", "0"],
        ["--batch-size", "5", "--num-envs", "3"],
        ["--env-options", "colour=red"],
        ["--reward-scale", "0"],
        ["--image-stem", "vgg"],
        ["--preset", "nonexistent"],
        ["--preset", "dmlab"],  # needs deepmind_lab, not installed here
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args):
    out = tmp_path / "run"
    base = [] if args[0] == "--preset" else TINY_ARGS
    assert train_cli.main([*base, "--out-dir", str(out), *args]) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert "error" in err and len(err.strip().splitlines()) == 1


def test_existing_run_dir_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert train_cli.main([*TINY_ARGS, "--out-dir", str(out)]) == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_presets_validate_and_follow_the_paper():
    for cfg in PRESETS.values():
        validate(cfg)
    with pytest.raises(ConfigError, match="image stem"):
        validate(PRESETS["atari"].updated(image_stem="vgg"))
    for name in ("dmlab", "atari", "procgen"):
        cfg = PRESETS[name]
        assert (
            cfg.optim.learning_rate,
            cfg.runtime.batch_size,
            cfg.loss.discount,
            cfg.optim.grad_clip,
        ) == (
            6e-4,
            32,
            0.99,
            40.0,
        )
        assert (
            cfg.loss.baseline_cost,
            cfg.loss.entropy_cost,
            RMS_ALPHA,
            RMS_EPS,
        ) == (
            0.5,
            0.01,
            0.99,
            0.01,
        )
    assert PRESETS["dmlab"].model.hidden_size == 512 and PRESETS["atari"].model.hidden_size == 256


def test_train_then_eval_writes_run_dir_and_eval_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli.main([*TINY_ARGS, "--out-dir", str(out)]) == 0
    for name in (
        "config.json",
        "metrics.csv",
        "curve.png",
        "eval.json",
        "checkpoints/latest.pt",
        "checkpoints/agent.pt",
    ):
        assert (out / name).is_file(), name
    meta = json.loads((out / "config.json").read_text())
    assert meta["config"]["model"]["hidden_size"] == 8 and "git_revision" in meta
    assert evaluate.main([str(out), "--sets", "3", "--episodes", "7", "--sampled"]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert (result["sets"], result["episodes_per_set"], result["actions"]) == (3, 7, "sampled")
    assert [len(r) for r in result["returns"]] == [7, 7, 7]
    means = [sum(r) / 7 for r in result["returns"]]
    assert result["set_means"] == pytest.approx(means)
    assert result["mean"] == pytest.approx(sum(means) / 3)
    assert all(x in (-1.0, 1.0) for r in result["returns"] for x in r)
    again = json.loads((out / "eval.json").read_text())
    assert evaluate.main([str(out), "--sets", "3", "--episodes", "7", "--sampled"]) == 0
    assert json.loads((out / "eval.json").read_text())["returns"] == again["returns"]
    # --out keeps the run's own evaluation: a greedy check elsewhere leaves eval.json alone.
    other = tmp_path / "greedy.json"
    assert (
        evaluate.main([str(out), "--sets", "2", "--episodes", "5", "--greedy", "--out", str(other)])
        == 0
    )
    assert json.loads(other.read_text())["actions"] == "greedy"
    kept = json.loads((out / "eval.json").read_text())
    assert (kept["actions"], kept["returns"]) == ("sampled", again["returns"])


def test_eval_of_a_mismatched_checkpoint_exits_2(tmp_path):
    out = tmp_path / "run"
    assert train_cli.main([*TINY_ARGS, "--out-dir", str(out), "--no-eval-at-end"]) == 0
    meta = json.loads((out / "config.json").read_text())
    meta["config"]["model"]["hidden_size"] = 9
    (out / "config.json").write_text(json.dumps(meta))
    assert evaluate.main([str(out)]) == 2
    assert not (out / "eval.json").exists()
    assert train_cli.main(["--resume", str(out)]) == 2


def test_resume_refuses_other_options(tmp_path):
    assert train_cli.main(["--resume", str(tmp_path), "--seed", "3"]) == 2
    assert tiny().segments_per_batch == 1


def test_load_a_pretrained_stem_and_freeze_it(tmp_path):
    first, second = tmp_path / "pre", tmp_path / "post"
    args = [*TINY_ARGS, "--no-eval-at-end", "--no-freeze-stem"]
    assert train_cli.main([*args, "--out-dir", str(first)]) == 0
    stem_file = first / "checkpoints" / "agent.pt"
    assert (
        train_cli.main(
            [
                *args,
                "--out-dir",
                str(second),
                "--seed",
                "5",
                "--load-stem",
                str(stem_file),
                "--freeze-stem",
            ]
        )
        == 0
    )
    pre = checkpoint.load(stem_file)["agent"]
    post = checkpoint.load(second / "checkpoints" / "agent.pt")["agent"]
    stem = [k for k in pre if k.startswith("stem.")]
    assert stem and all(torch.equal(pre[k], post[k]) for k in stem)
    assert not torch.equal(pre["core.F"], post["core.F"])
    missing = tmp_path / "nope.pt"
    assert (
        train_cli.main([*args, "--out-dir", str(tmp_path / "x"), "--load-stem", str(missing)]) == 2
    )
    assert not (tmp_path / "x").exists()


def test_machine_changes_names_only_what_changes_floats():
    now = {
        "cpu": "B",
        "cpu_capability": "AVX2",
        "torch": "2.13.0",
        "numpy": "2.4",
        "load_average": "1",
    }
    same = {**now, "cpu": "A", "load_average": "9"}  # another model, same kernels: no notice
    assert machine_changes(same, now) == []
    assert machine_changes(None, now) == [] and machine_changes("junk", now) == []
    assert machine_changes({"cpu_capability": "AVX512"}, now) == ["cpu_capability: AVX512 -> AVX2"]
    older = {**now, "torch": "2.12.0", "numpy": "2.3"}
    assert machine_changes(older, now) == ["torch: 2.12.0 -> 2.13.0", "numpy: 2.3 -> 2.4"]


def test_a_run_records_its_machine_and_a_resume_elsewhere_says_so(tmp_path, caplog):
    out = tmp_path / "run"
    # the runtime sets --num-threads after the record is written: the record says 2, where
    # this process (tests/conftest.py) runs 1
    assert torch.get_num_threads() == 1
    args = [*TINY_ARGS, "--out-dir", str(out), "--no-eval-at-end", "--num-threads", "2"]
    assert train_cli.main(args) == 0
    meta = json.loads((out / "config.json").read_text())
    recorded = dict(meta["machine"])
    assert recorded["torch_threads"] == 2
    assert recorded["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert (recorded["torch"], recorded["cpu_count"]) == (torch.__version__, os.cpu_count())
    with caplog.at_level(logging.WARNING, logger="r2ac.rl.harness.train_cli"):
        assert train_cli.main(["--resume", str(out)]) == 0
    assert "another machine" not in caplog.text
    meta["machine"]["cpu_capability"] = "AVX512-elsewhere"
    (out / "config.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="r2ac.rl.harness.train_cli"):
        assert train_cli.main(["--resume", str(out)]) == 0
    expected = f"cpu_capability: AVX512-elsewhere -> {recorded['cpu_capability']}"
    assert "resuming on another machine" in caplog.text and expected in caplog.text
