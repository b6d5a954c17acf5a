"""Nothing of a run is lost, whatever its directory holds, and every loaded value is
checked before use.

A latest.pt that is a folder, a FIFO, a link to a device or a dangling link is named for what
it is (never "no checkpoint"), and `--restart` keeps what it replaces; `copy --resume` never
starts over on a broken checkpoint and changes no file before its checks have passed; weights
that are not finite or not real are refused by eval; a type named in a checkpoint never
resolves to code; values that fit the structure but not the run (shapes, dtypes, counters, RNG states,
the optimiser) are one line in `train --resume`, `diagnose` and `copy --resume`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from r2ac.rl.run.run_dir import RunDir
from r2ac.runs import checkpoint
from r2ac.runs.older_checkpoints import OLDER_TAG

from .conftest import TINY, r2ac, r2ac_inline, tiny_args, write_body
from .test_malformed_inputs import COPY_ARGS, one_line, snapshot

LATEST = Path("checkpoints") / "latest.pt"


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory) -> Path:
    """A finished tiny `r2ac copy` run: copy it, do not modify it."""
    out = tmp_path_factory.mktemp("copy") / "run"
    args = ["--length", "2", "--hidden", "4", "--train-steps", "2", "--eval-every", "1"]
    proc = r2ac("copy", *args, "--test-size", "4", "--batch-size", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _special(path: Path, kind: str) -> str:
    """Replace `path` by a special file of `kind`; the words the refusal must hold."""
    path.unlink()
    if kind == "folder":
        path.mkdir()
        return "is a folder"
    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO"
    if kind == "device":
        path.symlink_to("/dev/zero")
        return "is a symlink to a device"
    path.symlink_to(path.parent / "gone.pt")
    return "is a dangling symlink"


@pytest.mark.parametrize("kind", ["folder", "fifo", "device", "dangling"])
def test_a_latest_pt_that_is_no_file_is_named_and_nothing_changes(kind, run_copy, capsys):
    words = _special(run_copy / LATEST, kind)
    before = snapshot(run_copy)
    for command in (["train", "--resume"], ["diagnose"]):
        code, lines = r2ac_inline(capsys, *command, str(run_copy))
        one_line(code, lines, words)
        assert "no checkpoint" not in lines[0], lines
    assert snapshot(run_copy) == before


def test_restart_keeps_what_it_replaces(run_copy, capsys):
    """The advice for a run without a checkpoint is followed: the earlier start's agent.pt,
    metrics and events are moved into replaced-<time>/, byte for byte."""
    (run_copy / LATEST).unlink()
    (run_copy / LATEST).symlink_to(run_copy / "nowhere.pt")
    meta = json.loads((run_copy / "config.json").read_text())
    meta["config"]["run"]["total_frames"] = 24 * 3
    (run_copy / "config.json").write_text(json.dumps(meta))
    kept = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file() and p.name != ".lock"}
    kept.pop(run_copy / "config.json")
    assert r2ac_inline(capsys, "train", "--restart", str(run_copy))[0] == 0
    (replaced,) = run_copy.glob("replaced-*")
    for path, content in kept.items():
        assert (replaced / path.relative_to(run_copy)).read_bytes() == content, path
    assert (replaced / LATEST).is_symlink()
    assert RunDir.open(run_copy).checkpoint_path.is_file()  # the new start's own


def _payload(run: Path) -> dict:
    return checkpoint.load(run / LATEST)


def _bad_obs(p):
    p["actors"][0]["obs"] = torch.zeros(3, 9)


def _bad_core_state(p):
    p["actors"][0]["state"]["c"] = torch.zeros(3, 5)


def _bad_sensitivity(p):
    fz, wb = p["actors"][0]["state"]["sens"]
    p["actors"][0]["state"]["sens"] = [fz[:, :, :4], wb]


def _float64_sensitivity(p):
    fz, wb = p["actors"][0]["state"]["sens"]
    p["actors"][0]["state"]["sens"] = [fz.double(), wb.double()]


def _optimizer_shape(p):
    p["learner"]["optimizer"]["state"][0]["square_avg"] = torch.zeros(3, 3)


def _lr_string(p):
    p["learner"]["optimizer"]["param_groups"][0]["lr"] = "fast"


def _expanded_obs(p):
    p["actors"][0]["obs"] = torch.zeros(1, 1).expand(400_000, 1_000_000)


def _strided_rng(p):
    p["rng"]["torch"] = torch.zeros(2 * 5056, dtype=torch.uint8)[::2]


def _counter(key, value):
    def edit(p):
        p["counters"][key] = value

    return edit


def _no_actors(p):
    p["actors"] = []


def _nan_weight(p):
    p["agent"]["core.F"] = torch.full_like(p["agent"]["core.F"], float("nan"))


BAD_VALUES = {
    "obs shape": (_bad_obs, "actors[0].obs: shape (3, 9), expected (3, 7)"),
    "core state shape": (_bad_core_state, "actors[0].state.c: shape (3, 5)"),
    "sensitivity shape": (_bad_sensitivity, "actors[0].state.sens[0]: shape"),
    "float64 sensitivities": (_float64_sensitivity, "dtype torch.float64, expected torch.float32"),
    "optimiser state shape": (_optimizer_shape, "learner.optimizer.state[0].square_avg: shape"),
    "lr a string": (_lr_string, "learner.optimizer.param_groups[0].lr: str 'fast'"),
    "expanded obs": (_expanded_obs, "actors[0].obs: a non-contiguous view"),
    "strided rng": (_strided_rng, "rng.torch: a non-contiguous view"),
    "update -50": (_counter("update", -50), "counters.update: -50"),
    "update 1e30": (_counter("update", 1e30), "counters.update should be an integer, not float"),
    "frames -1e9": (_counter("frames", -(10**9)), "counters.frames: -1,000,000,000"),
    "frames not updates x": (_counter("frames", 7), "expected updates x frames per update"),
    "no actors": (_no_actors, "actors: 0 actor states, expected one per actor (2)"),
    "NaN weights": (_nan_weight, "agent.core.F: holds non-finite values"),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_values_that_do_not_fit_are_one_line_and_change_nothing(case, run_copy, capsys):
    edit, words = BAD_VALUES[case]
    payload = _payload(run_copy)
    edit(payload)
    checkpoint.save_atomic(payload, run_copy / LATEST)
    before = snapshot(run_copy)
    one_line(*r2ac_inline(capsys, "train", "--resume", str(run_copy)), words)
    assert snapshot(run_copy) == before
    if case in ("obs shape", "lr a string", "no actors"):
        one_line(*r2ac_inline(capsys, "diagnose", str(run_copy)), words)


def test_a_good_checkpoint_still_resumes(run_copy, capsys):
    checkpoint.save_atomic(_payload(run_copy), run_copy / LATEST)  # read and written again
    code, lines = r2ac_inline(capsys, "diagnose", str(run_copy), "--batches", "1")
    assert code == 0, lines
    meta = json.loads((run_copy / "config.json").read_text())
    meta["config"]["run"]["total_frames"] += 24 * 2
    (run_copy / "config.json").write_text(json.dumps(meta))  # differs: refused, not resumed
    assert r2ac_inline(capsys, "train", "--resume", str(run_copy))[0] == 2


@pytest.mark.parametrize("args", [["--batches", "0"], ["--grad-batches", "-1"]])
def test_diagnose_refuses_bad_counts(args, run_copy, capsys):
    one_line(*r2ac_inline(capsys, "diagnose", str(run_copy), *args), args[0])


@pytest.mark.parametrize(
    "value,words",
    [(float("nan"), "non-finite"), (float("inf"), "non-finite"), (1j, "complex values")],
)
def test_eval_refuses_weights_that_are_not_finite_or_real(value, words, run_copy, capsys):
    agent = run_copy / "checkpoints" / "agent.pt"
    weights = checkpoint.load(agent)
    name = "core.F"
    t = weights["agent"][name]
    weights["agent"][name] = t * value if value == 1j else torch.full_like(t, value)
    checkpoint.save_atomic(weights, agent)
    (run_copy / "eval.json").unlink(missing_ok=True)
    one_line(*r2ac_inline(capsys, "eval", str(run_copy)), words)
    assert not (run_copy / "eval.json").exists()


def test_a_name_in_a_checkpoint_never_resolves_to_code(run_copy, tmp_path, monkeypatch, capsys):
    """A stdlib NamedTuple reached through an r2ac module (`uname` runs when one is built),
    named where a core state belongs: in an older (schema-1) body the converter refuses the
    name, in a schema-2 body the actor finds no fields of its state; one line naming the file
    either way, and a planted `uname` on PATH never runs."""
    bin_dir, marker = tmp_path / "bin", tmp_path / "marker"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text(f"#!/bin/sh\ntouch {marker}\necho x86_64\n")
    (bin_dir / "uname").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    payload = _payload(run_copy)
    for name in (
        "r2ac.runs.locked_dir:platform.uname_result",
        "r2ac.runs.run_dir:platform.uname_result",  # its name before the move
        "r2ac.rl.run.run_dir:Path",
    ):
        fields = ["Linux", "h", "r", "v", "m"]
        payload["actors"][0]["state"] = {OLDER_TAG: "namedtuple", "type": name, "fields": fields}
        write_body(payload, run_copy / LATEST)  # schema 1: the tag is read, the name refused
        code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
        one_line(code, lines, "latest.pt")
        assert f"actors[0].state: refused type {name!r}" in lines[0], lines
        checkpoint.save_atomic(payload, run_copy / LATEST)  # schema 2: plain data, no tag
        code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
        one_line(code, lines, "latest.pt")
        assert "actors[0].state: a dict of the keys ('__r2ac_encoded__'" in lines[0], lines
    payload["actors"][0]["state"] = "r2ac.runs.locked_dir:platform.uname_result"
    checkpoint.save_atomic(payload, run_copy / LATEST)
    one_line(*r2ac_inline(capsys, "train", "--resume", str(run_copy)), "actors[0].state: str")
    assert not marker.exists()


def test_copy_resume_never_starts_over_on_a_broken_checkpoint(copy_run, tmp_path, capsys):
    for kind in ("dangling", "fifo", "folder"):
        out = tmp_path / kind
        shutil.copytree(copy_run, out)
        words = _special(out / "checkpoint.pt", kind)
        before = snapshot(out)
        one_line(*r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(out)), words)
        assert snapshot(out) == before
    out = tmp_path / "gone"
    shutil.copytree(copy_run, out)
    (out / "checkpoint.pt").unlink()
    before = snapshot(out)
    one_line(*r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(out)), "results.json")
    assert snapshot(out) == before


def _curve_row(ck):
    ck["progress"]["curve"][0] = {"step": "x"}


def _adam_shape(ck):
    ck["optimizer"]["state"][0]["exp_avg"] = torch.zeros(2, 2)


def _negative_step(ck):
    ck["progress"]["step"] = -3


COPY_BAD = {
    "curve row": (_curve_row, "progress.curve[0]: columns"),
    "optimiser shape": (_adam_shape, "optimizer.state[0].exp_avg: shape (2, 2)"),
    "negative step": (_negative_step, "progress.step: -3"),
}


@pytest.mark.parametrize("case", COPY_BAD)
def test_copy_resume_checks_every_value_before_writing(case, copy_run, tmp_path, capsys):
    edit, words = COPY_BAD[case]
    out = tmp_path / "copy"
    shutil.copytree(copy_run, out)
    ck = checkpoint.load(out / "checkpoint.pt")
    edit(ck)
    checkpoint.save_atomic(ck, out / "checkpoint.pt")
    before = snapshot(out)
    one_line(*r2ac_inline(capsys, "copy", *COPY_ARGS, "--out", str(out)), words)
    assert snapshot(out) == before  # config.json and checkpoint.pt included


def test_fifos_are_refused_by_every_loader_without_waiting(copy_run, run_copy, tmp_path, capsys):
    fifo = tmp_path / "stem.pt"
    os.mkfifo(fifo)
    code, lines = r2ac_inline(
        capsys, "train", *TINY, "--load-stem", str(fifo), "--out-dir", str(tmp_path / "new")
    )
    one_line(code, lines, "is a FIFO")
    agent = run_copy / "checkpoints" / "agent.pt"
    agent.unlink()
    os.mkfifo(agent)
    one_line(*r2ac_inline(capsys, "eval", str(run_copy)), "is a FIFO")


@pytest.mark.parametrize("value", ["inf", "-1", "nan", "0"])
def test_a_checkpoint_size_limit_that_is_no_size_is_refused(value, run_copy, capsys, monkeypatch):
    monkeypatch.setenv("R2AC_MAX_CHECKPOINT_GIB", value)
    one_line(*r2ac_inline(capsys, "eval", str(run_copy)), "R2AC_MAX_CHECKPOINT_GIB")


def test_the_size_limit_sees_the_address_space_limit(monkeypatch):
    import resource

    monkeypatch.delenv("R2AC_MAX_CHECKPOINT_GIB", raising=False)
    real = resource.getrlimit
    used = checkpoint._proc_status().get("VmSize", 0)

    def limited(res):
        if res == resource.RLIMIT_AS:
            return (used + 3 * 2**30, resource.RLIM_INFINITY)
        return real(res)

    monkeypatch.setattr(resource, "getrlimit", limited)
    assert checkpoint.size_limit() <= 2 * 2**30  # half of the 3 GiB left, not of MemAvailable


def test_a_memory_error_while_reading_is_one_line(run_copy, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(checkpoint, "_read_checked", no_memory)
    one_line(*r2ac_inline(capsys, "train", "--resume", str(run_copy)), "not enough memory")


def test_a_file_size_limit_at_the_checkpoint_is_one_line(tmp_path, capsys, monkeypatch):
    def too_big(self, payload):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(RunDir, "save_checkpoint", too_big)
    out = tmp_path / "run"
    code, lines = r2ac_inline(capsys, "train", *tiny_args(2), "--out-dir", str(out))
    assert code == 1 and "ulimit -f" in lines[-1] and "intact" not in lines[-1], lines
    assert not any("Traceback" in ln for ln in lines)
