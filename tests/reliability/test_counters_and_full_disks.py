"""Issue 82's leftovers: the copy task refuses a checkpoint whose counters are out of range or
disagree (before results.json or anything else changes); a file size limit (EFBIG) is never
called a lack of free space; copy, eval and bench say a full disk after their up-front
probe in one line; loaders' value errors name the file."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
import torch

from r2ac.errors import write_failure_line
from r2ac.runs import checkpoint

from .conftest import r2ac, r2ac_inline
from .test_malformed_inputs import COPY_ARGS, one_line, snapshot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory) -> Path:
    """A finished tiny `r2ac copy` run (2 batches, a curve row after each): copy it."""
    out = tmp_path_factory.mktemp("copy") / "run"
    args = ["--length", "2", "--hidden", "4", "--train-steps", "2", "--eval-every", "1"]
    proc = r2ac("copy", *args, "--test-size", "4", "--batch-size", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _progress(**values):
    def edit(ck):
        ck["progress"].update(values)

    return edit


def _consistent_25_of_20(ck):
    """step 25 with 20 updates, the curve and the window made to agree with it."""
    ck["progress"].update(step=25, updates=20, window=[])
    ck["progress"]["curve"][-1].update(step=25, updates=20)


def _adam_steps(ck):
    for entry in ck["optimizer"]["state"].values():
        entry["step"] = entry["step"] * 0 + 7


def _curve_backwards(ck):
    ck["progress"]["curve"][0]["step"] = 2


COPY_COUNTERS = {
    "step 10**30": (
        _progress(step=10**30),
        "progress.step: 1,000,000,000,000,000,000,000,000,000,000",
    ),
    "step -1": (_progress(step=-1), "progress.step: -1"),
    "step 25, 20 updates": (_progress(step=25, updates=20), "progress.step: 25, expected 2"),
    "step 25, 20 updates, all agreeing": (
        _consistent_25_of_20,
        "progress.updates: 20 after 25 batches",
    ),
    "updates beyond the window": (_progress(updates=5), "progress.updates: 5, expected 2"),
    "Adam's step counts": (_adam_steps, "step: 7, expected 2 (progress.updates)"),
    "curve backwards": (_curve_backwards, "progress.curve[1].step: below the row before it"),
}


@pytest.mark.parametrize("case", COPY_COUNTERS)
def test_copy_counters_out_of_range_or_disagreeing_are_refused(case, copy_run, tmp_path, capsys):
    edit, words = COPY_COUNTERS[case]
    out = tmp_path / "copy"
    shutil.copytree(copy_run, out)
    ck = checkpoint.load(out / "checkpoint.pt")
    edit(ck)
    checkpoint.save_atomic(ck, out / "checkpoint.pt")  # a valid digest
    before = snapshot(out)
    code, lines = r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(out))
    one_line(code, lines, words)
    assert "checkpoint.pt" in lines[0], lines
    assert snapshot(out) == before  # results.json and config.json unchanged


def test_an_untouched_copy_checkpoint_still_resumes(copy_run, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(copy_run, out)
    code, lines = r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(out))
    assert code == 0, lines
    assert json.loads((out / "results.json").read_text())["train_steps"] == 4


@pytest.mark.parametrize("name", ["ENOSPC", "EDQUOT", "EFBIG", "EROFS"])
def test_write_failures_say_what_happened_and_what_to_do(name):
    line = write_failure_line(OSError(getattr(errno, name), "x", "/r/f.json"))
    assert line.startswith("cannot write /r/f.json: ") and "\n" not in line
    assert ("ulimit -f" in line) == (name == "EFBIG")
    assert ("free space" in line) == (name in ("ENOSPC", "EDQUOT"))
    assert write_failure_line(OSError(errno.EACCES, "x")) is None


def test_no_file_size_message_says_free_space():
    """Every message about EFBIG in r2ac comes from errors.write_failure: no module pairs
    'ulimit -f' with 'free space' by hand."""
    for path in (ROOT / "r2ac").rglob("*.py"):
        for line in path.read_text().splitlines():
            assert not ("ulimit -f" in line and "free space" in line), f"{path}: {line}"


def _full(code: int, name: str, real):
    """A writer that fails with `code` for files called `name` and writes the others."""

    def write(path, *args, **kwargs):
        if Path(path).name == name:
            raise OSError(code, "simulated", str(path))
        return real(path, *args, **kwargs)

    return write


@pytest.mark.parametrize(
    ("code_", "says", "not_says"),
    [
        (errno.ENOSPC, "the disk is full; free space", "ulimit"),
        (errno.EFBIG, "ulimit -f", "free space"),
    ],
)
def test_copy_says_a_full_disk_in_one_line(code_, says, not_says, tmp_path, monkeypatch, capsys):
    import r2ac.tasks.copy_cli as copy_cli

    monkeypatch.setattr(copy_cli, "write_json", _full(code_, "results.json", copy_cli.write_json))
    out = tmp_path / "copy"
    args = [a for a in COPY_ARGS if a != "--resume"]
    code, lines = r2ac_inline(capsys, "copy", *args, "--out", str(out))
    lines = [ln for ln in lines if "batch/s" not in ln and "s/batch" not in ln]  # the bar aside
    assert code == 1 and len(lines) == 1, (code, lines)
    assert says in lines[0] and not_says not in lines[0] and "--resume" in lines[0], lines
    assert "results.json" in lines[0] and "Traceback" not in lines[0], lines
    assert (out / "checkpoint.pt").is_file()  # what was written is intact


@pytest.mark.parametrize(
    ("code_", "says", "not_says"),
    [
        (errno.ENOSPC, "the disk is full; free space", "ulimit"),
        (errno.EFBIG, "ulimit -f", "free space"),
    ],
)
def test_eval_says_a_full_disk_in_one_line(code_, says, not_says, run_copy, monkeypatch, capsys):
    import r2ac.rl.run.evaluation as evaluation

    monkeypatch.setattr(evaluation, "write_json", _full(code_, "eval.json", evaluation.write_json))
    code, lines = r2ac_inline(capsys, "eval", str(run_copy), "--sets", "1", "--episodes", "2")
    assert code == 1 and len(lines) == 1, (code, lines)
    assert says in lines[0] and not_says not in lines[0] and "eval.json" in lines[0], lines
    assert not (run_copy / "eval.json").exists()


def test_train_names_the_file_size_limit_not_free_space(run_copy, monkeypatch, capsys):
    import r2ac.rl.harness.train_cli as train_cli

    def finish(*args):
        raise OSError(errno.EFBIG, "File too large", str(run_copy / "eval.json"))

    monkeypatch.setattr(train_cli, "finish", finish)
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    errors = [ln for ln in lines if "error" in ln]
    assert code == 1 and len(errors) == 1, lines
    assert "ulimit -f" in errors[0] and "free space" not in errors[0], errors


def test_a_loader_value_error_names_the_file(run_copy, capsys):
    """A value the runtime's restore refuses (a ConfigError of its own, without a path) is
    reported with the checkpoint's path."""
    path = run_copy / "checkpoints" / "latest.pt"
    payload = checkpoint.load(path)
    payload["actors"][0]["env"]["episode"][0] = -3
    checkpoint.save_atomic(payload, path)
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    one_line(code, lines, f"{path}: ")
    assert "env state episode: -3" in lines[0], lines


STREAM = ["--preset", "stream", "--env-options", "length=4", "--hidden-size", "8",
          "--stream-mlp", "8", "--num-agents", "2", "--total-frames", "40",
          "--checkpoint-every", "15", "--log-every", "10", "--no-progress",
          "--eval-sets", "1", "--eval-episodes", "2"]  # fmt: skip


@pytest.fixture(scope="module")
def stream_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stream") / "run"
    proc = r2ac("train", *STREAM, "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _env_t(p):
    p["env"]["t"][0] = 100


def _env_seeds(p):
    del p["env"]["seeds"]


def _strided_rng(p):
    p["rng"]["torch"] = torch.zeros(2 * p["rng"]["torch"].numel(), dtype=torch.uint8)[::2]


STREAM_DAMAGE = {
    "env t 100": (_env_t, "env state t: 100 at stream 0, expected 0..3"),
    "env seeds missing": (_env_seeds, "env state seeds: missing"),
    "strided rng": (_strided_rng, "rng.torch"),
}


@pytest.mark.parametrize("case", STREAM_DAMAGE)
def test_a_damaged_streaming_run_is_one_line_naming_the_file(case, stream_run, tmp_path, capsys):
    edit, words = STREAM_DAMAGE[case]
    run = tmp_path / "run"
    shutil.copytree(stream_run, run)
    (run / "eval.json").unlink()
    path = run / "checkpoints" / "latest.pt"
    payload = checkpoint.load(path)
    edit(payload)
    checkpoint.save_atomic(payload, path)
    before = snapshot(run)
    for command in (("eval", str(run)), ("train", "--resume", str(run))):
        code, lines = r2ac_inline(capsys, *command)
        one_line(code, lines, words)
        assert str(path) in lines[0], lines
        assert snapshot(run) == before
