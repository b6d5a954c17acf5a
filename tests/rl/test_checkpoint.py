"""Atomic checkpoint writes survive a crash mid-write."""

import pytest
import torch

from r2ac.rl import checkpoint


def test_round_trip(tmp_path):
    obj = {"step": 7, "weights": torch.arange(6.0).reshape(2, 3)}
    path = checkpoint.save_atomic(obj, tmp_path / "sub" / "ckpt.pt")
    assert path == tmp_path / "sub" / "ckpt.pt"
    loaded = checkpoint.load(path)
    assert loaded["step"] == 7
    torch.testing.assert_close(loaded["weights"], obj["weights"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.pt"]


def test_overwrite_replaces(tmp_path):
    path = tmp_path / "ckpt.pt"
    checkpoint.save_atomic({"step": 1}, path)
    checkpoint.save_atomic({"step": 2}, path)
    assert checkpoint.load(path) == {"step": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_crash_mid_write_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    checkpoint.save_atomic({"step": 1, "w": torch.ones(3)}, path)
    before = path.read_bytes()
    real_save = torch.save

    def crashing_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # write real bytes, then die before they are final
        f.truncate(f.tell() // 2)
        raise KeyboardInterrupt("simulated crash mid-write")

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_atomic({"step": 2, "w": torch.zeros(1000)}, path)
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert checkpoint.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left behind


def test_load_map_location_and_missing_file(tmp_path):
    path = checkpoint.save_atomic(torch.ones(2), tmp_path / "t.pt")
    assert checkpoint.load(path, map_location="cpu").device.type == "cpu"
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "absent.pt")
