"""Every command validates its options before it runs: one line, exit 2, nothing
allocated or written (bench, demo, plot, diagnose, copy, eval's and bench's output files)."""

from __future__ import annotations

import pytest

from .conftest import r2ac_inline
from .test_malformed_inputs import one_line

LONG = "x" * 300 + ".json"  # passes the permission check; no file system takes the name


@pytest.mark.parametrize(
    "args,words",
    [
        (["bench", "cores", "--sizes", "1000000"], "--sizes must be sizes in 1..4096"),
        (["bench", "cost", "--hidden-size", "1000000"], "GiB are available"),
        (["bench", "core", "--threads", "-1"], "--threads must be in 1..4096"),
        (["bench", "core", "--json-out", "/dev/full"], "not a regular file"),
        (["demo", "--shape", "0,0,0,0"], "--shape must be four positive integers"),
        (["demo", "--shape", "a"], "--shape must be four positive integers"),
        (["demo", "--shape", "1,1,100000,100000"], "GiB are available"),
        (["demo", "--repeats", "0"], "--repeats must be in 1..10,000"),
        (["bench", "envs", "--seconds", "-1"], "--seconds must be in (0, 3600]"),
        (["plot", "nowhere", "--out", "x.png", "--smooth", "-5"], "--smooth must be"),
        (["copy", "--lr", "1e30"], "--lr 1e+30 is above 10"),
        (["copy", "--seed", "-1"], "--seed must be in 0..2**63-1"),
    ],
)
def test_bad_options_are_one_line_before_anything_runs(args, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if args[0] == "copy":
        args = [*args, "--out", str(tmp_path / "copy")]
    one_line(*r2ac_inline(capsys, *args), words)
    assert not (tmp_path / "copy").exists()


def test_output_paths_that_cannot_be_written_are_refused_up_front(run_copy, tmp_path, capsys):
    bad = str(tmp_path / LONG)
    one_line(*r2ac_inline(capsys, "eval", str(run_copy), "--out", bad), "a name longer than")
    code, lines = r2ac_inline(capsys, "bench", "core", "--shapes", "2,2,4,4", "--json-out", bad)
    one_line(code, lines, "a name longer than")  # before the benchmark, not after it
    one_line(*r2ac_inline(capsys, "plot", str(run_copy), "--out", bad), "a name longer than")
