"""`r2ac bench stream` and every other bench check their options before any work (issue 82,
N6): a count out of range, an unknown core, an unwritable --json-out and absurd sizes are one
line and exit 2, in a moment; a disk that fills after the checks is one line, not a
traceback."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from r2ac.bench import stream

from .conftest import r2ac_inline


@pytest.fixture()
def no_work(monkeypatch):
    """Any measuring in `r2ac bench stream` fails the test: the checks must come first."""

    def work(*args, **kwargs):
        raise AssertionError("the bench started measuring")

    monkeypatch.setattr(stream, "copy_bandwidth", work)
    monkeypatch.setattr(stream, "measure_k", work)


@pytest.fixture()
def unwritable(tmp_path) -> str:
    """A path whose folder is a regular file."""
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file" / "rows.json")


STREAM_CASES = {
    "--ks 0": (["--ks", "0"], "--ks must be in 1..4,096, got 0"),
    "--ks 10**9": (["--ks", str(10**9)], "--ks must be in 1..4,096"),
    "--repeats 0": (["--repeats", "0"], "--repeats must be in 1..1,000, got 0"),
    "--threads 0": (["--threads", "0"], "--threads must be in 1..4,096, got 0"),
    "--copy-mb 0": (["--copy-mb", "0"], "--copy-mb must be in 1..65,536, got 0"),
    "--steps 0": (["--steps", "0"], "--steps must be in 1..10,000,000, got 0"),
    "--steps -1": (["--steps", "-1"], "--steps must be in 1..10,000,000, got -1"),
    "--steps 10**12": (["--steps", str(10**12)], "--steps must be in 1..10,000,000"),
    "--warmup -1": (["--warmup", "-1"], "--warmup must be in 0..10,000,000"),
    "unknown core": (["--cores", "elstm-rtrl", "nope"], "--cores: unknown 'nope'"),
}


@pytest.mark.parametrize("case", STREAM_CASES)
def test_bench_stream_options_are_checked_first(case, no_work, capsys):
    argv, words = STREAM_CASES[case]
    code, lines = r2ac_inline(capsys, "bench", "stream", *argv)
    assert code == 2 and len(lines) == 1, (code, lines)
    assert lines[0].startswith("r2ac bench stream: error: ") and words in lines[0], lines


def test_bench_stream_json_out_is_checked_before_the_run(no_work, unwritable, capsys):
    code, lines = r2ac_inline(capsys, "bench", "stream", "--json-out", unwritable)
    assert code == 2 and len(lines) == 1 and "--json-out" in lines[0], lines
    assert not Path(unwritable).exists()


OTHER_CASES = {
    "core --repeats 10**8": (["core", "--repeats", str(10**8)], "--repeats must be in 1..1,000"),
    "core --warmup 10**8": (["core", "--warmup", str(10**8)], "--warmup must be in 0..1,000"),
    "cores --repeats 0": (["cores", "--repeats", "0"], "--repeats >= 1"),
    "cores --threads 10**6": (["cores", "--threads", str(10**6)], "--threads must be in 0..4,096"),
    "cost --repeats 10**7": (["cost", "--repeats", str(10**7)], "--repeats must be in 1..1,000"),
    "runtime --repeats 0": (["runtime", "--repeats", "0"], "--repeats must be in 1..1,000"),
    "runtime --seconds -1": (["runtime", "--seconds", "-1"], "--seconds must be in (0, 86400]"),
    "runtime unknown": (["runtime", "--runtimes", "nope"], "invalid choice 'nope'"),
    "runtime train options": (
        ["runtime", "--runtimes", "serial", "--", "--hidden-size", "0"],
        "--runtimes serial: sizes must be positive",
    ),
    "rtrl-e2e 10**7": (["rtrl-e2e", str(10**7)], "ITERATIONS must be in 11..100,000"),
    "rtrl-e2e train options": (["rtrl-e2e", "20", "--bogus"], "--bogus: not an option of"),
    "random-policy --sets 0": (["random-policy", "builtin/delayed-cue", "--sets", "0"], "--sets"),
    "random-policy stdlib": (["random-policy", "gym/this:X-v0"], "standard library"),
    "peer --frames 0": (["peer", "--frames", "0"], "--frames must be in 1.."),
    "peer --seeds": (["peer", "--seeds", "x-y"], "--seeds"),
    "peer --success 2": (["peer", "--success", "2"], "--success must be in (0, 1]"),
}


@pytest.mark.parametrize("case", OTHER_CASES)
def test_every_bench_checks_its_options_first(case, capsys):
    argv, words = OTHER_CASES[case]
    code, lines = r2ac_inline(capsys, "bench", *argv)
    assert code == 2 and len(lines) == 1, (code, lines)
    assert words in lines[0] and "Traceback" not in lines[0], lines


@pytest.mark.parametrize("bench", ["core", "cores", "runtime", "peer"])
def test_every_bench_checks_its_json_out_first(bench, unwritable, capsys):
    code, lines = r2ac_inline(capsys, "bench", bench, "--json-out", unwritable)
    assert code == 2 and len(lines) == 1 and "--json-out" in lines[0], lines


def test_cost_checks_its_out_folder_first(unwritable, capsys):
    code, lines = r2ac_inline(capsys, "bench", "cost", "--out", str(Path(unwritable).parent))
    assert code == 2 and len(lines) == 1 and "--out" in lines[0], lines


TINY_STREAM = ["--ks", "1", "--cores", "feedforward", "--steps", "2", "--warmup", "0"]
TINY_STREAM += ["--repeats", "1", "--copy-mb", "1"]


@pytest.mark.parametrize(
    ("code_", "says", "not_says"),
    [
        (errno.ENOSPC, "the disk is full; free space", "ulimit"),
        (errno.EFBIG, "the file size limit (ulimit -f)", "free space"),
    ],
)
def test_a_disk_full_after_the_checks_is_one_line(
    code_, says, not_says, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "rows.json"

    def full(self, *args, **kwargs):
        raise OSError(code_, "simulated", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    code, lines = r2ac_inline(capsys, "bench", "stream", *TINY_STREAM, "--json-out", str(out))
    assert code == 1 and len(lines) == 1, (code, lines)
    assert says in lines[0] and not_says not in lines[0] and str(out) in lines[0], lines
