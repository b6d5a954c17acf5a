"""Atomic checkpoint writes survive a crash mid-write."""

import pytest
import torch

from r2ac.rtrl import core_names, make_core
from r2ac.runs import checkpoint


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


def test_crash_after_the_bytes_are_written_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    checkpoint.save_atomic({"step": 1}, path)
    before = path.read_bytes()

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        checkpoint.save_atomic({"step": 2, "w": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_numpy_values_and_namedtuples_round_trip(tmp_path):
    import numpy as np

    from r2ac.rtrl.elstm.math import ELSTMState

    state = ELSTMState(torch.ones(2, 3), None)
    obj = {
        "np": np.arange(5, dtype=np.uint32),
        "scalar": np.float64(2.5),
        "state": state,
        "rng": ("MT19937", np.arange(3, dtype=np.uint32), 1, 0, 0.0),
        3: [1, (2, 3)],
    }
    loaded = checkpoint.load(checkpoint.save_atomic(obj, tmp_path / "c.pt"))
    assert loaded["np"].dtype == np.uint32 and loaded["np"].tolist() == [0, 1, 2, 3, 4]
    assert isinstance(loaded["scalar"], np.float64) and loaded["scalar"] == 2.5
    assert type(loaded["state"]) is ELSTMState and loaded["state"].sens is None
    assert loaded["state"].c.equal(state.c)
    assert loaded["rng"][0] == "MT19937" and loaded["rng"][1].tolist() == [0, 1, 2]
    assert loaded[3] == [1, (2, 3)]


def test_only_project_namedtuples_are_rebuilt(tmp_path):
    forged = {checkpoint.TAG: "namedtuple", "type": "os:system", "fields": ["true"]}
    path = checkpoint.save_atomic({"x": forged}, tmp_path / "f.pt")
    with pytest.raises(checkpoint.CheckpointError, match="refused type 'os:system'"):
        checkpoint.load(path)


def test_carried_sensitivities_round_trip_and_forged_buffers_are_refused(tmp_path):
    """An RTRL state (its sensitivities are FlatTensors, not a NamedTuple) survives a
    checkpoint; a tagged buffer naming any other class is refused."""
    from r2ac.rtrl import ELSTM
    from r2ac.rtrl.elstm.math import ELSTMSensitivity, ELSTMState

    layer = ELSTM(3, 4, "rtrl", dtype=torch.float64)
    with torch.no_grad():
        _, state = layer(torch.randn(5, 2, 3, dtype=torch.float64), layer.initial_state(2))
    loaded = checkpoint.load(checkpoint.save_atomic({"s": state}, tmp_path / "s.pt"))["s"]
    assert type(loaded) is ELSTMState and type(loaded.sens) is ELSTMSensitivity
    for ours, theirs in zip(loaded.sens.tensors(), state.sens.tensors(), strict=True):
        assert ours.equal(theirs) and float(theirs.abs().sum()) > 0
    forged = {checkpoint.TAG: "carried", "type": "r2ac.rtrl.elstm.math:ELSTMState", "fields": []}
    path = checkpoint.save_atomic({"x": forged}, tmp_path / "f.pt")
    with pytest.raises(checkpoint.CheckpointError, match="not a FlatTensors"):
        checkpoint.load(path)


@pytest.mark.parametrize("name", core_names(include_memoryless=True))
def test_every_cores_state_round_trips(tmp_path, name):
    """The state of every registered core, sensitivities included (a trainer's checkpoint
    holds them), loads back as the same types and values: each state type is allowed."""
    from torch.utils import _pytree as pytree

    torch.manual_seed(0)
    core = make_core(name, 3, 4, dtype=torch.float64)
    with torch.no_grad():
        _, state = core(torch.randn(5, 2, 3, dtype=torch.float64), core.initial_state(2))
    loaded = checkpoint.load(checkpoint.save_atomic({"s": state}, tmp_path / "s.pt"))["s"]
    assert type(loaded) is type(state)
    want, got = pytree.tree_leaves(state), pytree.tree_leaves(loaded)
    assert [t is None for t in got] == [t is None for t in want]
    assert all(a is None or a.equal(b) for a, b in zip(got, want, strict=True))
