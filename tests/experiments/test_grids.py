"""`r2ac experiment`: grid definitions, flag spelling, resumable runner, tables and curves.

The end-to-end tests train a tiny grid with real `r2ac train` subprocesses (a few seconds).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.experiments import cli, grids, report, runner
from r2ac.experiments.grids import Grid, RunSpec, Task, Variant
from r2ac.rl.config import TrainConfig, from_dict

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
        "total_frames": 256,
        "eval_sets": 2,
        "eval_episodes": 4,
        "log_every": 1,
        "checkpoint_every": 2,
    },
    note="tiny",
)
TINY = Grid(
    "tiny",
    "a tiny grid for tests",
    (TINY_TASK,),
    (Variant("elstm-rtrl", 4), Variant("feedforward", 4)),
    default_seeds=2,
)


@pytest.mark.parametrize("name", sorted(grids.GRIDS))
def test_every_grid_run_has_a_valid_config(name):
    g = grids.GRIDS[name]
    specs = grids.runs_of(g, g.default_seeds)
    assert sum(s.agents for s in specs) == len(g.tasks) * len(g.variants) * g.default_seeds
    assert len({s.run_id for s in specs}) == len(specs)  # one directory per run
    for spec in specs:
        cfg = runner.check_overrides(spec.preset, spec.overrides())
        assert (cfg.model.core, cfg.run.seed, cfg.stream.num_agents) == (
            spec.variant.core,
            spec.seed,
            spec.agents,
        )
        # a streaming row has no segments; a batched row its M
        assert cfg.streaming or cfg.runtime.unroll_length == spec.unroll_length


def test_popgym_grid_full_episode_rows_use_each_task_s_episode_length():
    g = grids.GRIDS["popgym"]
    assert len(g.tasks) >= 8
    for spec in grids.runs_of(g, 1):
        if spec.variant.unroll_length == grids.FULL_EPISODE:
            assert spec.unroll_length == spec.task.episode_steps >= 14  # MineSweeperEasy: 14
            assert spec.variant.label.endswith("M=episode") and "__Mep__" in spec.run_id
        else:
            assert spec.unroll_length == spec.variant.unroll_length == 4


def test_memory_m_spans_short_and_long_segments_against_the_cue_delay():
    g = grids.GRIDS["memory-m"]
    span = int(dict(o.split("=") for o in grids.DELAYED_CUE.overrides["env_options"])["delay"]) + 1
    ms = sorted({v.unroll_length for v in g.variants if v.core != "feedforward"})
    assert ms[0] < span / 4 and ms[-1] > span  # shortest M far below the span, longest above
    assert {v.core for v in g.variants} == {"elstm-rtrl", "elstm-bptt", "feedforward"}


def test_train_args_round_trip_through_the_real_cli():
    overrides = {
        "env_options": ("delay=7",),
        "unroll_length": 9,
        "freeze_stem": False,
        "lr_decay": True,
        "forget_bias": None,
        "learning_rate": 1e-3,
        "mlp_hidden": (5, 6),
    }
    args = runner.train_args(overrides)
    assert "--no-freeze-stem" in args and "--lr-decay" in args
    from r2ac.rl.harness.train_cli import parse_config

    cfg = parse_config(["--preset", "delayed-cue", *args])
    for key, value in overrides.items():
        assert cfg.flat()[key] == value, key


def test_bad_names_are_config_errors():
    with pytest.raises(ConfigError, match="unknown experiment"):
        grids.grid("nope")
    with pytest.raises(ConfigError, match="no task"):
        grids.select_tasks(grids.GRIDS["memory-m"], ("nope",))
    with pytest.raises(ConfigError, match="seeds"):
        grids.runs_of(TINY, 0)
    bad = RunSpec(TINY_TASK, Variant("elstm-nope", 4), 0)
    with pytest.raises(ConfigError, match="unknown core"):
        runner.check_overrides(bad.task.preset, bad.overrides())
    assert cli.main(["nope"]) == 2


def test_mean_curve_interpolates_seeds_onto_one_grid():
    a = (np.array([0.0, 10.0]), np.array([0.0, 1.0]))
    b = (np.array([0.0, 5.0, 20.0]), np.array([1.0, 1.0, 1.0]))
    x, mean, std = report.mean_curve([a, b], points=3)
    assert x.tolist() == [0.0, 5.0, 10.0]  # up to the shorter run
    assert mean.tolist() == [0.5, 0.75, 1.0]
    assert std.tolist() == [0.5, 0.25, 0.0]


def test_format_cell_reports_population_std_and_partial_seeds():
    assert report.format_cell([1.0, 0.0], 2) == "0.500 ± 0.500 (1.000 / 0.000)"
    assert report.format_cell([1.0, 0.0], 3) == "0.500 ± 0.500 (1.000 / 0.000) (2/3 seeds)"
    assert report.format_cell([1.0], 3) == "1.000 ± 0.000 (1/3 seeds)"
    assert report.format_cell([], 3) == "-"


def test_eval_protocol_names_each_columns_episodes_and_mode():
    reactive = {t.name: t for t in grids.grid("reactive").tasks}
    assert report.eval_protocol(reactive["cartpole"]) == "cartpole: 3 sets x 100 episodes, greedy"
    assert (
        report.eval_protocol(reactive["seaquest-cpu"])
        == "seaquest-cpu: 5 sets x 30 episodes, sampled"
    )


@pytest.fixture
def tiny_grid(monkeypatch):
    monkeypatch.setitem(grids.GRIDS, "tiny", TINY)
    return TINY


def test_grid_trains_reports_and_resumes(tiny_grid, tmp_path, capsys):
    out = tmp_path / "exp"
    assert cli.main(["tiny", "--jobs", "2", "--out", str(out)]) == 0
    specs = grids.runs_of(TINY, 2)
    for spec in specs:
        run_dir = out / "runs" / spec.run_id
        assert runner.run_state(run_dir) == "finished"
        cfg = from_dict(json.loads((run_dir / "config.json").read_text())["config"])
        assert isinstance(cfg, TrainConfig) and cfg.run.seed == spec.seed
        assert (cfg.model.core, cfg.runtime.unroll_length, cfg.run.total_frames) == (
            spec.variant.core,
            4,
            256,
        )
    md = (out / "results.md").read_text()
    assert "per column: " + report.eval_protocol(TINY.tasks[0]) in md
    assert f"({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} CPUs" in md  # machine
    scores = json.loads((out / "results.json").read_text())["runs"]
    assert len(scores) == 4 and all(-1.0 <= r["eval_mean"] <= 1.0 for r in scores.values())
    # The table cell is the mean +- std of the two seeds' eval scores, then each seed's.
    rtrl = [scores[s.run_id]["eval_mean"] for s in specs if s.variant.core == "elstm-rtrl"]
    mean, std = report.mean_std(rtrl)
    each = " / ".join(f"{v:.3f}" for v in rtrl)
    assert f"| elstm-rtrl M=4 | {mean:.3f} ± {std:.3f} ({each}) |" in md
    train = [
        scores[s.run_id]["final_train_return"] for s in specs if s.variant.core == "elstm-rtrl"
    ]
    mean, std = report.mean_std(train)
    each = " / ".join(f"{v:.3f}" for v in train)
    assert md.count("| elstm-rtrl M=4 |") == 2
    assert f"| elstm-rtrl M=4 | {mean:.3f} ± {std:.3f} ({each}) |" in md
    assert (out / "curves_cue.png").stat().st_size > 1000

    # Resume: a finished run is skipped, an interrupted one (no eval.json) is resumed from its
    # checkpoint, a run that crashed before any checkpoint is started again.
    done, interrupted, crashed = (out / "runs" / s.run_id for s in specs[:3])
    before = (done / "eval.json").stat().st_mtime_ns
    (interrupted / "eval.json").unlink()
    (crashed / "eval.json").unlink()
    (crashed / "checkpoints" / "latest.pt").unlink()
    assert runner.command_for(specs[1], interrupted, None)[-2:] == ["--resume", str(interrupted)]
    results = runner.run_grid(specs, out, jobs=1)
    assert [r.status for r in results] == ["done", "ran", "ran", "done"]
    assert (done / "eval.json").stat().st_mtime_ns == before
    assert all(runner.run_state(out / "runs" / s.run_id) == "finished" for s in specs)

    # A run of another config (the grid was edited since) is flagged, and nothing starts.
    saved = json.loads((done / "config.json").read_text())
    saved["config"]["model"]["hidden_size"] = 16
    (done / "config.json").write_text(json.dumps(saved))
    assert (
        runner.config_mismatch(
            interrupted, runner.check_overrides("delayed-cue", specs[1].overrides())
        )
        == []
    )
    capsys.readouterr()
    assert cli.main(["tiny", "--out", str(out), "--dry-run"]) == 0
    states = dict(reversed(ln.split()) for ln in capsys.readouterr().out.splitlines())
    assert states == {s.run_id: "stale" if s == specs[0] else "finished" for s in specs}
    assert cli.main(["tiny", "--out", str(out)]) == 2
    assert (done / "eval.json").stat().st_mtime_ns == before  # refused, not overwritten


def test_a_different_frame_budget_is_refused_on_resume(tiny_grid, tmp_path):
    out = tmp_path / "exp"
    out.mkdir()
    (out / "experiment.json").write_text(json.dumps({"total_frames": None}))
    assert cli.main(["tiny", "--out", str(out), "--total-frames", "128"]) == 2


def test_config_mismatch_names_the_differing_fields(tmp_path):
    expected = TrainConfig.make(hidden_size=8, env_options=("delay=3",), out_dir="a")
    saved = json.loads(json.dumps(expected.flat()))  # a flat config.json, as older runs wrote
    saved.update(out_dir="elsewhere", progress=False)  # where and how it was shown: not compared
    del saved["grad_clip"]  # a field the run predates: not compared
    (tmp_path / "config.json").write_text(json.dumps({"config": saved}))
    assert runner.config_mismatch(tmp_path, expected) == []
    saved.update(hidden_size=16, env_options=["delay=4"])
    (tmp_path / "config.json").write_text(json.dumps({"config": saved}))
    assert runner.config_mismatch(tmp_path, expected) == ["env_options", "hidden_size"]
    assert runner.config_mismatch(tmp_path / "missing", expected) == []


def test_dry_run_lists_without_training(tiny_grid, tmp_path, capsys):
    out = tmp_path / "exp"
    assert cli.main(["tiny", "--out", str(out), "--dry-run", "--seeds", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == ["new", "new"]
    assert not out.exists()


def test_cores_select_rows():
    g = grids.GRIDS["popgym"]
    sub = grids.select_cores(g, ("elstm-rtrl", "gru-bptt"))
    assert [v.label for v in sub.variants] == [
        "elstm-rtrl M=4",
        "gru-bptt M=4",
        "gru-bptt M=episode",
    ]
    assert grids.select_cores(g, ()) is g
    with pytest.raises(ConfigError, match=r"no rows with core in \['elman-rtrl'\]"):
        grids.select_cores(g, ("elman-rtrl",))


def test_unroll_lengths_select_rows(tiny_grid, tmp_path, capsys):
    g = grids.GRIDS["memory-m"]
    sub = grids.select_unroll_lengths(g, (50, 100))
    assert {v.unroll_length for v in sub.variants} == {50, 100}
    assert len(sub.variants) == 4 and sub.tasks == g.tasks
    assert grids.select_unroll_lengths(g, ()) is g
    with pytest.raises(ConfigError, match=r"no rows with M in \[7\]"):
        grids.select_unroll_lengths(g, (7, 50))
    out = tmp_path / "exp"
    assert (
        cli.main(["tiny", "--out", str(out), "--dry-run", "--seeds", "1", "--unroll-lengths", "4"])
        == 0
    )
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert cli.main(["tiny", "--out", str(out), "--unroll-lengths", "3"]) == 2
    assert not out.exists()


def test_curve_of_skips_rows_without_episodes(tmp_path):
    (tmp_path / "metrics.csv").write_text("frames,return_mean\n10,\n20,0.5\n")
    frames, returns = report.curve_of(tmp_path)
    assert frames.tolist() == [20.0] and returns.tolist() == [0.5]
    assert not math.isnan(returns[0])


def test_final_train_return_averages_the_last_tenth(tmp_path):
    rows = "\n".join(f"{10 * i},{1.0 if i >= 18 else 0.0}" for i in range(20))
    (tmp_path / "metrics.csv").write_text("frames,return_mean\n" + rows + "\n")
    assert report.final_train_return(tmp_path) == 1.0  # the last 2 of 20 rows
    assert report.final_train_return(tmp_path, fraction=0.2) == 0.5
    assert report.final_train_return(tmp_path / "missing") is None


def test_suite_column_is_the_mean_of_normalised_task_means():
    assert grids.popgym_normalised(-1.0) == 0.0 and grids.popgym_normalised(1.0) == 1.0
    per_task = [[0.5, 0.7], [-1.0, -0.8]]  # task means 0.6 and -0.9 -> 0.8 and 0.05
    assert report.suite_cell(per_task, grids.popgym_normalised) == "0.425"
    assert report.suite_cell([[0.5], []], grids.popgym_normalised) == "-"
    assert report.suite_cell([[0.5], [0.1, 0.3]], grids.popgym_normalised).endswith(
        "(seeds differ by task)"
    )
    assert grids.grid("popgym").suite_score is grids.popgym_normalised
    assert grids.grid("memory-m").suite_score is None


def test_popgym_grid_covers_every_family_popgym_registers():
    g = grids.GRIDS["popgym"]
    assert len(g.tasks) == 14 == len({t.name for t in g.tasks})
    assert g.tasks == grids.popgym_tasks("easy") == grids.POPGYM_TASKS
    assert all(t.overrides["env"].endswith("Easy-v0") for t in g.tasks)
    gym = pytest.importorskip("gymnasium", reason="gymnasium is not installed")
    pytest.importorskip("popgym", reason="popgym (the popgym extra) is not installed")
    registered = {
        k.removeprefix("popgym-").removesuffix("Easy-v0")
        for k in gym.registry
        if k.startswith("popgym-") and k.endswith("Easy-v0")
    }
    assert {f.env for f in grids.POPGYM_FAMILIES} == registered


@pytest.mark.parametrize("difficulty, level", [("medium", 1), ("hard", 2)])
def test_difficulty_picks_popgym_s_ids_and_episode_lengths(difficulty, level):
    g = grids.select_difficulty(grids.GRIDS["popgym"], difficulty)
    for task, family in zip(g.tasks, grids.POPGYM_FAMILIES, strict=True):
        assert task.name == f"{family.name}-{difficulty}"
        assert task.overrides["env"] == f"gym/popgym-{family.env}{difficulty.title()}-v0"
        assert task.episode_steps == family.episode_steps[level]
    assert grids.select_difficulty(g, None) is g
    with pytest.raises(ConfigError, match="unknown difficulty 'extreme'"):
        grids.select_difficulty(g, "extreme")
    with pytest.raises(ConfigError, match="no difficulty levels"):
        grids.select_difficulty(grids.GRIDS["reactive"], difficulty)


def test_popgym_dry_run_lists_every_family_at_the_difficulty(tmp_path, capsys):
    out = tmp_path / "exp"
    argv = ["popgym", "--out", str(out), "--dry-run", "--seeds", "1", "--cores", "rtu-rtrl"]
    assert cli.main([*argv, "--difficulty", "hard"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expected = [f"new {f.name}-hard__rtu-rtrl__M4__s0" for f in grids.POPGYM_FAMILIES]
    assert [" ".join(ln.split()) for ln in lines] == expected
    assert cli.main(argv) == 0  # the default: Easy, the names of the runs made before
    assert "new repeat-first__rtu-rtrl__M4__s0" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["reactive", "--out", str(out), "--dry-run", "--difficulty", "easy"]) == 2
    assert not out.exists()


def test_popgym_suite_score_averages_all_14_families():
    per_task = [[1.0]] * 7 + [[-1.0]] * 7  # normalised: seven 1s and seven 0s
    assert len(grids.GRIDS["popgym"].tasks) == len(per_task)
    assert report.suite_cell(per_task, grids.popgym_normalised) == "0.500"


def test_popgym_success_threshold_where_scripts_give_both_levels():
    tasks = {t.name: t for t in grids.popgym_tasks("easy")}
    # RepeatPrevious: memoryless -0.5, optimum 1: 80 % of the gap is 0.7
    assert tasks["repeat-previous"].success_at == pytest.approx(0.7, abs=1e-12)
    assert grids.popgym_tasks("hard")[1].success_at == pytest.approx(0.7, abs=1e-12)
    # no scripted memoryless level: means and spreads only
    assert tasks["count-recall"].success_at is None
    assert report.successes([0.9, 0.69, 0.7], 0.7) == "; 2/3 >= 0.70"
    assert report.successes([0.9], None) == "" and report.successes([], 0.7) == ""
