"""Run directories are never shared or overwritten, and their files are written atomically."""

from __future__ import annotations

import errno
import json
import os
import shutil

from r2ac.rl.harness.train_cli import parse_config
from r2ac.rl.run.run_dir import COLUMNS, RunDir, default_out_dir, drop_rows_after, read_metrics
from r2ac.runs import checkpoint

from .conftest import error_lines, r2ac, r2ac_inline, tiny_args


def test_a_second_process_on_a_locked_run_dir_exits_with_one_line(run_copy):
    lock = checkpoint.lock_directory(run_copy)  # this process plays the first one
    try:
        before = (run_copy / "metrics.csv").read_bytes()
        proc = r2ac("train", "--resume", str(run_copy))
        assert proc.returncode == 2
        lines = error_lines(proc)
        assert len(lines) == 1 and f"in use by another process (pid {os.getpid()})" in lines[0]
        assert (run_copy / "metrics.csv").read_bytes() == before
    finally:
        os.close(lock)


def test_copy_refuses_a_locked_or_non_empty_out(tmp_path, capsys):
    out = tmp_path / "copy"
    args = ["copy", "--length", "2", "--hidden", "8", "--train-steps", "2", "--out", str(out)]
    out.mkdir()
    (out / "results.json").write_text("{}")
    code, lines = r2ac_inline(capsys, *args)
    assert code == 2 and len(lines) == 1 and "not empty; add --resume" in lines[0], lines
    assert (out / "results.json").read_text() == "{}"
    (out / "results.json").unlink()  # results without a checkpoint: refused
    lock = checkpoint.lock_directory(out)
    try:
        code, lines = r2ac_inline(capsys, *args, "--resume")
        assert code == 2 and len(lines) == 1 and "in use by another process" in lines[0], lines
    finally:
        os.close(lock)


def test_a_run_stopped_before_its_first_checkpoint_is_restarted(run_copy, capsys):
    shutil.rmtree(run_copy / "checkpoints")
    (run_copy / "checkpoints").mkdir()
    (run_copy / "checkpoints" / ".latest.pt.x1y2.tmp").write_bytes(b"half a checkpoint")
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    assert code == 2 and len(lines) == 1 and f"--restart {run_copy}" in lines[0], lines
    code, lines = r2ac_inline(capsys, "train", *tiny_args(2), "--out-dir", str(run_copy))
    assert code == 2 and len(lines) == 1 and f"--restart {run_copy}" in lines[0], lines

    meta = json.loads((run_copy / "config.json").read_text())
    meta["config"]["run"]["total_frames"] = 24 * 10  # no checkpoint to disagree with; a short rerun
    (run_copy / "config.json").write_text(json.dumps(meta))
    assert r2ac_inline(capsys, "train", "--restart", str(run_copy))[0] == 0
    assert [int(r["update"]) for r in read_metrics(run_copy / "metrics.csv")] == list(range(1, 11))
    assert not list((run_copy / "checkpoints").glob("*.tmp"))  # the killed write's temp file
    code, lines = r2ac_inline(capsys, "train", "--restart", str(run_copy))
    assert code == 2 and len(lines) == 1 and f"--resume {run_copy}" in lines[0], lines


def test_a_run_with_a_checkpoint_is_never_overwritten(run_copy, capsys):
    before = (run_copy / "checkpoints" / "latest.pt").read_bytes()
    code, lines = r2ac_inline(capsys, "train", *tiny_args(2), "--out-dir", str(run_copy))
    assert code == 2 and len(lines) == 1 and f"--resume {run_copy}" in lines[0], lines
    assert (run_copy / "checkpoints" / "latest.pt").read_bytes() == before


def test_resume_refuses_a_config_json_edited_since_the_checkpoint(run_copy, capsys):
    path = run_copy / "config.json"
    meta = json.loads(path.read_text())
    meta["config"]["env"]["options"] = ["delay=5"]
    meta["config"]["run"]["eval_episodes"] = 7  # evaluation settings may change
    path.write_text(json.dumps(meta))
    code, lines = r2ac_inline(capsys, "train", "--resume", str(run_copy))
    assert code == 2 and len(lines) == 1, lines
    assert "env_options: checkpoint ['delay=3'], config.json ['delay=5']" in lines[0], lines
    assert "eval_episodes" not in lines[0]


def test_default_run_names_do_not_collide(tmp_path, monkeypatch):
    """Two runs of one process in the same second get different names. The clock is held at
    one second: the test must not depend on both calls falling into it (they once did not)."""
    monkeypatch.setattr("r2ac.rl.run.run_dir.time.strftime", lambda fmt, *when: "20261128-034147")
    cfg = parse_config(tiny_args(2))
    first = default_out_dir(cfg, tmp_path)
    assert f"-{os.getpid()}" in first
    RunDir.create(first, cfg).release()
    second = default_out_dir(cfg, tmp_path)  # the same second, the same process
    assert second != first and second.startswith(first)


def _write_rows(path, updates, tail=""):
    header = ",".join(COLUMNS)
    rows = [",".join([str(u), str(24 * u)] + ["0"] * (len(COLUMNS) - 2)) for u in updates]
    path.write_text("\n".join([header, *rows]) + "\n" + tail)


def test_metrics_rows_after_the_checkpoint_are_dropped_atomically(tmp_path):
    path = tmp_path / "metrics.csv"
    _write_rows(path, range(1, 11), tail="11,264,0.5")  # a row cut short by a kill
    inode = path.stat().st_ino
    drop_rows_after(path, 5)
    assert [int(r["update"]) for r in read_metrics(path)] == [1, 2, 3, 4, 5]
    assert path.stat().st_ino != inode  # a new file renamed into place, not an in-place edit
    stamp = (path.stat().st_ino, path.stat().st_mtime_ns)
    drop_rows_after(path, 5)  # nothing to drop: the file is not touched
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == stamp
    assert not [p for p in tmp_path.iterdir() if p.name != "metrics.csv"]


def test_metrics_read_while_a_run_writes_them_give_only_whole_rows(tmp_path):
    """A reader polling a live run sees an empty file, a header cut short, or a row cut short."""
    path = tmp_path / "metrics.csv"
    header = ",".join(COLUMNS)
    for text in ("", header[:7], header, header + "\n"):
        path.write_text(text)
        assert read_metrics(path) == [], repr(text)
    _write_rows(path, [1, 2], tail="3,72,0.5")
    rows = read_metrics(path)
    assert [r["update"] for r in rows] == [1.0, 2.0] and rows[1]["frames"] == 48.0


def test_a_full_disk_stops_training_with_one_line(tmp_path, capsys, monkeypatch):
    def full_disk(self, payload):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunDir, "save_checkpoint", full_disk)
    out = tmp_path / "run"
    code, lines = r2ac_inline(capsys, "train", *tiny_args(2), "--out-dir", str(out))
    assert code == 1 and lines[-1].startswith("r2ac train: error: cannot write to"), lines
    # the disk was full at the first checkpoint: no claim of an intact one
    assert "No space left on device" in lines[-1] and f"--restart {out}" in lines[-1]
    assert "no checkpoint was written yet" in lines[-1] and "intact" not in lines[-1]
    assert not any("Traceback" in ln for ln in lines)
