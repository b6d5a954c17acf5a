"""Parallel runtime: a few updates with two actor processes, policy lag logged, clean shutdown."""

from __future__ import annotations

import math

import pytest
import torch.multiprocessing as mp

from r2ac.rl.run.run_dir import RunDir, read_metrics
from r2ac.rl.runtimes.parallel import ParallelRuntime

from .rl_helpers import tiny


@pytest.mark.parametrize("core", ["elstm-rtrl", "elstm-bptt"])
def test_parallel_runtime_trains_logs_lag_and_shuts_down(tmp_path, core):
    cfg = tiny(
        runtime="parallel", num_actors=2, total_frames=4 * 3 * 8, checkpoint_every=4, core=core
    )
    run = RunDir.create(tmp_path / "run", cfg)
    runtime = ParallelRuntime(cfg, run)
    before = {k: v.clone() for k, v in runtime.agent.state_dict().items()}
    processes = []
    real_start = runtime.start

    def start():
        real_start()
        processes.extend(runtime.processes)

    runtime.start = start
    tracker = runtime.train()
    assert tracker.update == 8 and tracker.frames == 96
    assert len(processes) == 2 and not any(p.is_alive() for p in processes)
    assert all(p.exitcode == 0 for p in processes)
    assert not mp.active_children()
    rows = read_metrics(run.metrics_path)
    assert [r["update"] for r in rows] == list(range(1, 9))
    lags = [r["policy_lag"] for r in rows]
    assert all(math.isfinite(x) and x >= 0 for x in lags) and max(lags) >= 1
    after = runtime.agent.state_dict()
    assert any(not (after[k] == before[k]).all() for k in after)
    assert run.checkpoint_path.is_file()
