"""The streaming grids of `r2ac experiment`: which runs they list, seeds in
lockstep (one run, `--num-agents K`) read back per agent, and a tiny grid trained end to end.
"""

from __future__ import annotations

import json

import pytest

from r2ac.errors import ConfigError
from r2ac.experiments import cli, grids, report, runner
from r2ac.experiments.grids import Grid, RunSpec, Task, Variant
from r2ac.rl.config import from_dict
from r2ac.rl.presets import PRESETS

STREAM_CORES = ["rtu-rtrl", "elstm-rtrl", "lru-rtrl", "rtu-bptt", "gru-bptt", "feedforward"]
ABOVE = ["rtu-rtrl", "elstm-rtrl", "lru-rtrl", "rtu-bptt", "gru-bptt"]  # layers above the core


def _resolved(spec: RunSpec, total_frames: int | None = None) -> dict:
    """The run's config, by flat field names."""
    return runner.check_overrides(spec.preset, spec.overrides(total_frames)).flat()


@pytest.mark.parametrize(
    "name, preset_name, streaming",
    [("stream-memory-chain", "stream", "ac"), ("stream-q-memory-chain", "stream-q", "q")],
)
def test_memory_chain_grid_is_one_lockstep_run_per_length_and_core(name, preset_name, streaming):
    if preset_name not in PRESETS:
        pytest.skip(f"no --preset {preset_name}")
    g = grids.grid(name)
    specs = grids.runs_of(g, g.default_seeds)
    assert len(specs) == 7 * 11 and all(s.agents == 3 and s.seeds == (0, 1, 2) for s in specs)
    lengths = [2, 4, 8, 16, 32, 64, 128]
    assert [t.name for t in g.tasks] == [f"memory-chain-{n}" for n in lengths]
    # no segment length: no "M="
    assert [v.label for v in g.variants] == STREAM_CORES + [f"{c} (layers above)" for c in ABOVE]
    frames = {}
    for spec in specs:
        length = int(spec.task.name.rsplit("-", 1)[1])
        above = spec.variant.name is not None
        tag = "__layers-above" if above else ""
        assert spec.run_id == f"memory-chain-{length}__{spec.variant.core}{tag}__s0-2"
        overrides = spec.overrides()
        cfg = _resolved(spec)
        layers = PRESETS[preset_name].stream.stream_mlp
        assert (cfg["stream_mlp"], cfg["stream_top_mlp"]) == (
            ((), (128, 128)) if above else (layers, ())
        )
        assert "unroll_length" not in overrides and overrides["num_agents"] == 3
        cfg = _resolved(spec)
        assert cfg["env"] == "builtin/memory-chain" and cfg["env_options"] == (f"length={length}",)
        assert (cfg["algorithm"], cfg["num_agents"]) == (f"stream-{streaming}", 3)
        assert (cfg["core"], cfg["seed"]) == (spec.variant.core, 0)
        assert not cfg["prev_action"] and not cfg["last_reward"]  # the bit must be in the core
        frames[length] = cfg["total_frames"]  # steps per agent
    # 10,000 episodes or 1 M steps, whichever is less
    assert frames == {n: min(10_000 * n, 1_000_000) for n in lengths}
    assert frames[128] == 1_000_000 and frames[64] == 640_000
    assert g.success_threshold == 0.9


def test_stream_popgym_grid_runs_streaming_cores_beside_batched_ppo():
    g = grids.grid("stream-popgym")
    envs = ["CountRecall", "RepeatFirst", "Concentration", "Autoencode", "HigherLower"]
    assert [t.overrides["env"] for t in g.tasks] == [f"gym/popgym-{e}Easy-v0" for e in envs]
    assert [v.label for v in g.variants] == [
        "rtu-rtrl",
        "elstm-rtrl",
        "rtu-bptt",
        "rtu-rtrl M=4 (--preset popgym)",
    ]
    specs = grids.runs_of(g, 3)
    # per task: 3 streaming rows of one 3-agent run each, and PPO's 3 runs of one seed each
    assert len(specs) == 5 * (3 + 3) and sum(s.agents for s in specs) == 5 * 4 * 3
    for spec in specs:
        cfg = _resolved(spec)
        assert cfg["total_frames"] == 1_000_000 and cfg["prev_action"]
        if spec.variant.streaming:
            assert spec.agents == 3 and spec.preset == "stream"
            assert (cfg["algorithm"], cfg["num_agents"]) == ("stream-ac", 3)
            assert cfg["entropy_cost"] == 0.095  # the anchor's on POPGym
        else:
            assert spec.agents == 1 and spec.preset == "popgym"
            assert spec.run_id.endswith(f"__rtu-rtrl__M4__popgym__s{spec.seed}")
            assert (cfg["runtime"], cfg["algorithm"], cfg["unroll_length"]) == ("serial", "ppo", 4)
            assert cfg["entropy_cost"] == PRESETS["popgym"].flat()["entropy_cost"]
    assert g.suite_score is grids.popgym_normalised


def test_batched_grids_keep_their_labels_and_run_ids():
    spec = RunSpec(grids.DELAYED_CUE, Variant("elstm-rtrl", 10), 2)
    assert spec.variant.label == "elstm-rtrl M=10"
    assert spec.run_id == "delayed-cue__elstm-rtrl__M10__s2"
    assert "num_agents" not in spec.overrides() and spec.overrides()["unroll_length"] == 10
    assert all(
        s.agents == 1 for name in ("memory-m", "popgym") for s in grids.runs_of(grids.grid(name), 3)
    )


def test_one_seed_is_a_plain_run_and_m_selection_leaves_streaming_rows_out():
    g = grids.grid("stream-memory-chain")
    (spec,) = grids.runs_of(g, 1, g.tasks[:1])[:1]
    assert spec.agents == 1 and spec.run_id == "memory-chain-2__rtu-rtrl__s0"
    assert "num_agents" not in spec.overrides()
    with pytest.raises(ConfigError, match=r"no rows with M in \[4\]"):
        grids.select_unroll_lengths(g, (4,))
    ppo = grids.select_unroll_lengths(grids.grid("stream-popgym"), (4,))
    assert [v.label for v in ppo.variants] == ["rtu-rtrl M=4 (--preset popgym)"]


def _write_run(out, spec: RunSpec, agent_means: list[float], train_return: float) -> None:
    run_dir = out / "runs" / spec.run_id
    run_dir.mkdir(parents=True)
    agents = [
        {"seed": spec.seed + k, "mean": m, "set_means": [m]} for k, m in enumerate(agent_means)
    ]
    eval_json = {"mean": sum(agent_means) / len(agent_means), "num_agents": len(agents)}
    (run_dir / "eval.json").write_text(json.dumps({**eval_json, "agents": agents[::-1]}))
    rows = "\n".join(f"{3000 * i},{train_return}" for i in range(1, 11))
    (run_dir / "metrics.csv").write_text("frames,return_mean\n" + rows + "\n")


def test_report_reads_each_lockstep_agent_as_a_seed(tmp_path):
    g = grids.grid("stream-memory-chain")
    g = grids.select_cores(g, ("rtu-rtrl", "feedforward"))
    tasks = g.tasks[:2]
    specs = grids.runs_of(g, 3, tasks)
    assert len(specs) == 6  # rtu-rtrl, feedforward, rtu-rtrl (layers above)
    by_id = {(s.task.name, s.variant.label): s for s in specs}
    _write_run(tmp_path, by_id["memory-chain-2", "rtu-rtrl"], [1.0, 0.95, -0.1], 0.5)
    _write_run(tmp_path, by_id["memory-chain-2", "feedforward"], [0.02, -0.04, 0.0], 0.0)
    _write_run(tmp_path, by_id["memory-chain-4", "rtu-rtrl"], [1.0, 1.0, 0.9], 0.9)
    # memory-chain-4 / feedforward: not run
    assert runner.read_eval_per_seed(tmp_path / "runs" / specs[0].run_id) == [1.0, 0.95, -0.1]

    table = report.markdown_table(g, tasks, specs, tmp_path, 3)
    mean, std = report.mean_std([1.0, 0.95, -0.1])
    assert (
        f"| rtu-rtrl | {mean:.3f} ± {std:.3f} (1.000 / 0.950 / -0.100) "
        "| 0.967 ± 0.047 (1.000 / 1.000 / 0.900) |" in table
    )
    assert "| feedforward | -0.007 ± 0.025 (0.020 / -0.040 / 0.000) | - |" in table
    assert "| rtu-rtrl (layers above) | - | - |" in table  # not run
    assert "chance 0, optimum 1" in table  # the tasks' notes

    solved = report.markdown_table(g, tasks, specs, tmp_path, 3, notes=False, threshold=0.9)
    assert "| rtu-rtrl | 2/3 (1.00, 0.95, -0.10) | 3/3 (1.00, 1.00, 0.90) |" in solved
    assert "| feedforward | 0/3 (0.02, -0.04, 0.00) | - |" in solved

    train = report.markdown_table(g, tasks, specs, tmp_path, 3, report.final_train_return)
    assert "| rtu-rtrl | 0.500 (pooled over 3 seeds) | 0.900 (pooled over 3 seeds) |" in train

    path, _ = report.write_report(g, tasks, specs, tmp_path, 3, "header")
    md = path.read_text()
    assert "Solved (evaluation score >= 0.9)" in md and "Lockstep rows" in md
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    first = runs[specs[0].run_id]
    assert first["seeds"] == [0, 1, 2] and first["eval_per_seed"] == [1.0, 0.95, -0.1]
    assert (tmp_path / "curves_memory-chain-2.png").exists()


def test_stream_grid_trains_end_to_end_through_the_runner(tmp_path, capsys):
    out = tmp_path / "exp"
    argv = ["stream-memory-chain", "--tasks", "memory-chain-2", "memory-chain-4"]
    argv += ["--cores", "feedforward", "--seeds", "2", "--total-frames", "200", "--jobs", "2"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    g = grids.select_cores(grids.grid("stream-memory-chain"), ("feedforward",))
    specs = grids.runs_of(g, 2, g.tasks[:2])
    assert [s.run_id for s in specs] == [
        "memory-chain-2__feedforward__s0-1",
        "memory-chain-4__feedforward__s0-1",
    ]
    for spec in specs:
        run_dir = out / "runs" / spec.run_id
        assert runner.run_state(run_dir) == "finished"
        saved = from_dict(json.loads((run_dir / "config.json").read_text())["config"]).flat()
        assert (saved["num_agents"], saved["total_frames"], saved["seed"]) == (2, 200, 0)
        assert len(runner.read_eval_per_seed(run_dir)) == 2
    md = (out / "results.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| feedforward | "))
    assert row.count("±") == 2 and "seeds)" not in row  # two cells of 2 seeds each
    assert "Solved (evaluation score >= 0.9)" in md
    assert "| feedforward |" in capsys.readouterr().out  # the table, printed


def test_a_tiny_lockstep_grid_of_other_tasks_works_too():
    task = Task("t", "stream", {"env_options": ("length=3",)})
    g = Grid("g", "", (task,), (Variant("rtu-rtrl", None), Variant("rtu-rtrl", 4, preset="popgym")))
    assert [s.agents for s in grids.runs_of(g, 2)] == [1, 1, 1, 1]  # not lockstep: a run a seed
    lock = Grid("g", "", (task,), g.variants, lockstep_seeds=True)
    assert [(s.agents, s.run_id) for s in grids.runs_of(lock, 2)] == [
        (2, "t__rtu-rtrl__s0-1"),
        (1, "t__rtu-rtrl__M4__popgym__s0"),
        (1, "t__rtu-rtrl__M4__popgym__s1"),
    ]
