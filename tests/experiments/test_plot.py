"""`r2ac plot`: the trailing mean's arithmetic, a PNG per call, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from r2ac.experiments import plot

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "r2ac.cli", "plot"]


def test_trailing_mean_by_hand():
    frames = np.array([10.0, 20.0, 30.0, 40.0])
    values = np.array([1.0, 3.0, 5.0, 7.0])
    # window 20: rows in (f - 20, f] -> [1], [1, 3], [3, 5], [5, 7]
    np.testing.assert_allclose(plot.trailing_mean(frames, values, 20.0), [1, 2, 4, 6])
    np.testing.assert_array_equal(plot.trailing_mean(frames, values, 0.0), values)


def _run_dir(path: Path) -> Path:
    path.mkdir()
    rows = [
        "update,frames,return_mean,value_scale",
        "1,128,,1.0",
        "2,256,-0.5,2.0",
        "3,384,0.5,4.0",
    ]
    (path / "metrics.csv").write_text("\n".join(rows) + "\n")
    return path


def _plot(*args: str) -> subprocess.CompletedProcess:
    command = [*COMMAND, *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_writes_a_png_and_refuses_bad_input(tmp_path):
    a, b = _run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")
    png = tmp_path / "fig.png"
    ok = _plot(str(a), str(b), "--metrics", "return_mean", "value_scale", "--out", str(png))
    assert ok.returncode == 0, ok.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    columns = plot.run_columns(a, ["return_mean"])
    np.testing.assert_array_equal(columns["return_mean"][0], [256, 384])  # empty row dropped
    unknown = _plot(str(a), "--metrics", "sigma", "--out", str(png))
    assert unknown.returncode == 2 and "no column 'sigma'" in unknown.stderr
    missing = _plot(str(tmp_path / "nowhere"), "--out", str(png))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    labels = _plot(str(a), str(b), "--labels", "one", "--out", str(png))
    assert labels.returncode == 2 and "1 labels for 2 runs" in labels.stderr
