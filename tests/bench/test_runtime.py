"""`r2ac bench runtime`: runs stopped by --seconds, the learner's figures, the JSON out.

scripts/gpu_check.sh's e2e step times elstm-rtrl against elstm-bptt with this command on a
GPU machine, each run cut after a fixed time; here the same path runs
on the CPU with the built-in task."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from r2ac.bench import runtime

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "r2ac.cli", "bench", "runtime"]


def test_learner_figures_take_the_steady_rows(tmp_path):
    metrics = tmp_path / "metrics.csv"
    rows = [
        f"{u},{u * 10},{u},{ms},{peak}"
        for u, ms, peak in [(1, 900, 10), (2, 5, 11), (3, 6, 12), (4, 7, 12), (5, 8, 13)]
    ]
    metrics.write_text("update,frames,time_s,learner_ms,learner_cuda_peak_mib\n" + "\n".join(rows))
    # the first fifth (update 1, start-up) is left out: median of 5, 6, 7, 8
    assert runtime.learner_figures(metrics) == (6.5, 13.0)
    metrics.write_text(
        "update,frames,time_s,learner_ms,learner_cuda_peak_mib\n1,10,1,5,\n2,20,2,7,\n"
    )
    ms, peak = runtime.learner_figures(metrics)
    assert ms == 6.0 and math.isnan(peak)  # two rows: none dropped; a CPU learner: no peaks


def test_runs_cut_after_seconds_report_both_cores(tmp_path):
    out = tmp_path / "fps.json"
    total = 3_000_000  # more than 4 s can train (only --seconds ends the runs), yet finite
    cmd = [
        *COMMAND,
        "--runtimes",
        "serial@elstm-bptt",
        "serial@elstm-rtrl",
        "--repeats",
        "1",
        "--seconds",
        "4",
        "--json-out",
        str(out),
        "--",
        "--total-frames",
        str(total),
        "--num-envs",
        "4",
        "--batch-size",
        "4",
        "--hidden-size",
        "16",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "serial@elstm-rtrl / serial@elstm-bptt: frames/s" in done.stdout
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"serial@elstm-bptt", "serial@elstm-rtrl"}
    for (row,) in runs.values():
        assert row["fps"] > 0 and row["learner_ms"] > 0
        assert math.isnan(row["cuda_peak_mib"])  # NaN in JSON: Python's json reads it back
        assert row["wall_s"] < 120
