"""Bad input gets one line naming the file or option, exit 2, and changes nothing.

Checkpoints with a correct checksum but a malformed structure, in each of the four loaders
(train --resume, eval, copy --resume, --load-stem); config.json damaged in three ways; a
checkpoint too large to read; bad values and options of train, eval, copy and bench.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from r2ac.runs import checkpoint
from r2ac.runs.older_checkpoints import OLDER_TAG

from .conftest import TINY, error_lines, r2ac, r2ac_inline, write_body

TAG = OLDER_TAG
# Data-only structures a weights-only unpickler builds, none of them what a loader expects
# (in schema 2 the tags of schema 1 are plain strings: no loader reads them)
MALFORMED = {
    "empty dict": {},
    "list": [1, 2, 3],
    "agent a string": {"agent": "hello"},
    "ndarray tag on a string": {"agent": {TAG: "ndarray", "data": "hello"}},
    "namedtuple type an int": {"agent": {TAG: "namedtuple", "type": 7, "fields": []}},
    "namedtuple fields wrong": {
        "agent": {TAG: "namedtuple", "type": "r2ac.rtrl.elstm.layer:ELSTMState", "fields": [1]}
    },
    "unknown tag": {"agent": {TAG: "mystery"}},
    "weights not tensors": {"agent": {"stem.layers.0.weight": "hello"}},
}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (the lock file aside) by its content's digest."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != checkpoint.LOCK_NAME
    }


def one_line(code: int, lines: list[str], name: str, expect_code: int = 2) -> None:
    assert code == expect_code and len(lines) == 1, (code, lines)
    assert name in lines[0] and "Traceback" not in lines[0], lines


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory) -> Path:
    """A finished tiny `r2ac copy` run (its checkpoint.pt is replaced by the tests' copies)."""
    out = tmp_path_factory.mktemp("copy") / "run"
    args = ["--length", "2", "--hidden", "4", "--train-steps", "2", "--eval-every", "1"]
    proc = r2ac("copy", *args, "--test-size", "4", "--batch-size", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


COPY_ARGS = ["--length", "2", "--hidden", "4", "--train-steps", "4", "--eval-every", "1"]
COPY_ARGS += ["--test-size", "4", "--batch-size", "2", "--resume"]


@pytest.mark.parametrize("kind", MALFORMED)
def test_malformed_checkpoints_are_refused_by_every_loader(
    kind, run_copy, copy_run, tmp_path, capsys
):
    payload = MALFORMED[kind]
    latest = run_copy / "checkpoints" / "latest.pt"
    checkpoint.save_atomic(payload, latest)
    before = snapshot(run_copy)
    one_line(*r2ac_inline(capsys, "train", "--resume", str(run_copy)), "latest.pt")
    checkpoint.save_atomic(payload, run_copy / "checkpoints" / "agent.pt")
    before = snapshot(run_copy)
    one_line(*r2ac_inline(capsys, "eval", str(run_copy)), "agent.pt")
    assert snapshot(run_copy) == before
    out = tmp_path / "copy"
    shutil.copytree(copy_run, out)
    checkpoint.save_atomic(payload, out / "checkpoint.pt")
    before = snapshot(out)
    one_line(*r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(out)), "checkpoint.pt")
    assert snapshot(out) == before  # config.json is not rewritten before the refusal
    stem = run_copy / "checkpoints" / "agent.pt"
    new = tmp_path / "new"
    code, lines = r2ac_inline(
        capsys, "train", *TINY, "--load-stem", str(stem), "--out-dir", str(new)
    )
    one_line(code, lines, "agent.pt")
    assert not new.exists()


# Tagged entries of a schema-1 body that the converter refuses, and the words it says
MALFORMED_SCHEMA_1 = {
    "ndarray tag on a string": ({TAG: "ndarray", "data": "hello"}, "its data is str"),
    "namedtuple type an int": ({TAG: "namedtuple", "type": 7, "fields": []}, "type int"),
    "namedtuple fields wrong": (
        {TAG: "namedtuple", "type": "r2ac.rtrl.elstm.math:ELSTMState", "fields": [1]},
        "ELSTMState with 1 fields, expected 2",
    ),
    "unknown tag": ({TAG: "mystery"}, "unknown tag 'mystery'"),
    "unknown type": ({TAG: "carried", "type": "os:system", "fields": []}, "refused type"),
}


@pytest.mark.parametrize("kind", MALFORMED_SCHEMA_1)
def test_malformed_schema_1_entries_are_refused_in_one_line(kind, run_copy, capsys):
    entry, words = MALFORMED_SCHEMA_1[kind]
    payload = checkpoint.load(run_copy / "checkpoints" / "latest.pt")
    payload["actors"][0]["state"] = entry
    write_body(payload, run_copy / "checkpoints" / "latest.pt")
    before = snapshot(run_copy)
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    one_line(code, lines, "latest.pt: actors[0].state: ")
    assert words in lines[0], lines
    assert snapshot(run_copy) == before


def test_a_copy_checkpoint_that_fails_to_load_leaves_config_json(copy_run, tmp_path, capsys):
    """Structure right, values wrong (the optimiser's state of another model): refused after
    reading it back, and config.json is still the one of the run."""
    out = tmp_path / "copy"
    shutil.copytree(copy_run, out)
    ck = checkpoint.load(out / "checkpoint.pt")
    ck["optimizer"]["param_groups"] = []
    checkpoint.save_atomic(ck, out / "checkpoint.pt")
    before = snapshot(out)
    one_line(*r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(out)), "checkpoint.pt")
    assert snapshot(out) == before


def test_copy_resume_refuses_a_missing_folder(tmp_path, capsys):
    code, lines = r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(tmp_path / "nothere"))
    one_line(code, lines, "does not exist")
    assert not (tmp_path / "nothere").exists()


def test_a_bare_state_dict_as_agent_pt_evaluates_with_a_warning(run_copy, caplog, capsys):
    agent = run_copy / "checkpoints" / "agent.pt"
    torch.save(checkpoint.load(agent)["agent"], agent)  # a foreign, bare state_dict
    (run_copy / "eval.json").unlink(missing_ok=True)
    code, lines = r2ac_inline(capsys, "eval", str(run_copy), "--sets", "1", "--episodes", "2")
    assert code == 0 and (run_copy / "eval.json").is_file(), lines
    assert any("no checksum" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"config": {"env": "\xff\xfe"}}', "not UTF-8"),
        (b'{"config": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"config": {}}', "lacks env"),
        (b"[1, 2]", "no config object"),
    ],
    ids=["not-utf8", "deep", "emptied", "list"],
)
def test_damaged_config_json_is_refused_by_resume_and_eval(content, words, run_copy, capsys):
    (run_copy / "config.json").write_bytes(content)
    before = snapshot(run_copy)
    for args in (["train", "--resume"], ["eval"]):
        code, lines = r2ac_inline(capsys, *args, str(run_copy))
        one_line(code, lines, "config.json")
        assert words in lines[0], lines
    assert snapshot(run_copy) == before


def test_a_huge_sparse_checkpoint_is_refused_by_its_size(run_copy, capsys):
    """1 TiB of holes: refused by its size, before a byte of it is read; the limit is said."""
    agent = run_copy / "checkpoints" / "agent.pt"
    with agent.open("r+b") as f:
        f.truncate(2**40)
    code, lines = r2ac_inline(capsys, "eval", str(run_copy))
    one_line(code, lines, "agent.pt")
    assert "1024.0 GiB" in lines[0] and "limit" in lines[0] and "without reading" in lines[0]
    limit = checkpoint.size_limit()
    assert limit >= checkpoint.MIN_LIMIT  # generous: a real agent.pt is a few MB


def test_the_size_limit_is_set_by_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "x.pt"
    checkpoint.save_atomic({"w": torch.zeros(300_000)}, path)  # ~1.2 MB
    monkeypatch.setenv("R2AC_MAX_CHECKPOINT_GIB", "0.001")  # ~1.07 MB
    with pytest.raises(checkpoint.CheckpointError, match=r"limit 0\.0 GiB: R2AC_MAX_CHECK"):
        checkpoint.load(path)
    monkeypatch.setenv("R2AC_MAX_CHECKPOINT_GIB", "1")
    assert checkpoint.load(path)["w"].numel() == 300_000


@pytest.mark.parametrize(
    "content, words",
    [
        (b"R2AC-CHECKPOINT 2\nsha256 00 3\nabc", "damaged checkpoint header (first line"),
        (b"R2AC-CHECKPOINX 1\n" + bytes(200), "damaged checkpoint header"),
        (np.random.default_rng(0).bytes(4000), "not a checkpoint"),
        (b"", "not a checkpoint (neither"),
    ],
    ids=["magic-version", "magic-letter", "random", "empty"],
)
def test_unreadable_files_are_named_for_what_is_wrong(content, words, tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load(path)
    message = str(err.value)
    assert words in message and "pop from empty list" not in message, message
    assert "run code" not in message, message


def test_load_stem_of_a_folder_says_it_is_a_folder(run_copy, tmp_path, capsys):
    new = tmp_path / "new"
    folder = run_copy / "checkpoints"
    code, lines = r2ac_inline(
        capsys, "train", *TINY, "--load-stem", str(folder), "--out-dir", str(new)
    )
    one_line(code, lines, "is a folder, not a checkpoint file")
    assert "cannot write" not in lines[0] and not new.exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["train", "--eval-episodes", "100000000"],
            "eval_episodes=100000000 (must be at most 100,000)",
        ),
        (["train", "--eval-sets", "5000"], "at most 1,000"),
        (["train", "--out-dir", ""], "--out-dir is empty"),
        (["train", "--env-options", "delay=3", "delay=4"], "'delay' twice"),
        (["eval", "--seed", "-1", "RUN"], "--seed must be in 0..2**63-1, got -1"),
        (["eval", "--episodes", "100000000", "RUN"], "--episodes must be in 1..100,000"),
        (["bench", "core", "--shapes", "1,1,100000,100000"], "needs about 223.5 GiB"),
    ],
    ids=["eval-episodes", "eval-sets", "out-dir", "env-options", "seed", "episodes", "bench"],
)
def test_bad_values_are_refused_in_one_line(args, words, run_copy, tmp_path, capsys, monkeypatch):
    args = [str(run_copy) if a == "RUN" else a for a in args]
    before = snapshot(run_copy)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # a default run directory would land here
    code, lines = r2ac_inline(capsys, *args)
    one_line(code, lines, words)
    assert snapshot(run_copy) == before and not list(cwd.iterdir())


def test_copy_of_a_huge_length_is_refused_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "copy"
    code, lines = r2ac_inline(capsys, "copy", "--length", "100000000", "--out", str(out))
    one_line(code, lines, "GiB are available; lower --length")
    assert not out.exists()


def test_a_diverging_run_stops_in_one_line(tmp_path):
    """--learning-rate 1e30: the first update's weights overflow; nothing of it is published
    (no NaN policy reaches an actor) or checkpointed."""
    out = tmp_path / "run"
    args = [*TINY, "--total-frames", "240", "--learning-rate", "1e30", "--out-dir", str(out)]
    proc = r2ac("train", *args)
    lines = [ln for ln in error_lines(proc) if not ln.startswith("run directory")]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "training diverged at update 1" in lines[0] and "--learning-rate 1e+30" in lines[0]
    assert not (out / "checkpoints" / "latest.pt").exists()
    assert json.loads((out / "config.json").read_text())["config"]["optim"]["learning_rate"] == 1e30
