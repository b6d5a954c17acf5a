"""Checkpoint files: atomic writes survive a crash mid-write; the body is plain data under a
versioned schema; core states round trip through their plain form; older bodies convert."""

import importlib
import io

import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree

from r2ac.flat import FlatTensors
from r2ac.rtrl.elstm.math import ELSTMState
from r2ac.rtrl.registry import core_names, make_core
from r2ac.rtrl.state import plain_state, state_from_plain
from r2ac.runs import checkpoint, older_checkpoints
from tests.reliability.conftest import write_body


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


def _body(path):
    """The unpickled body of a checkpoint file (after its two header lines)."""
    data = path.read_bytes()
    start = data.index(b"\n", len(checkpoint.MAGIC)) + 1
    return torch.load(io.BytesIO(data[start:]), weights_only=True)


def test_the_body_is_the_schema_and_the_plain_content(tmp_path):
    obj = {"w": torch.ones(2), "n": [1, 2.5, None, "x", (True, 3)], 4: {"k": torch.zeros(1)}}
    path = checkpoint.save_atomic(obj, tmp_path / "c.pt")
    body = _body(path)
    assert set(body) == {"schema", "content"} and body["schema"] == checkpoint.SCHEMA == 2
    assert body["content"]["n"] == [1, 2.5, None, "x", (True, 3)]
    loaded = checkpoint.load(path)
    assert loaded["w"].equal(obj["w"]) and loaded[4]["k"].equal(obj[4]["k"])


@pytest.mark.parametrize(
    "value,words",
    [
        (np.arange(3), "x is a ndarray"),
        (np.float64(2.5), "x is a float64"),
        (ELSTMState(torch.ones(1, 2), None), "x is a ELSTMState"),
        (torch.Size([2]), "x is a Size"),
        ({1.5: 2}, "x has a key of type float"),
    ],
)
def test_only_plain_data_is_written(tmp_path, value, words):
    path = checkpoint.save_atomic({"step": 1}, tmp_path / "c.pt")
    before = path.read_bytes()
    with pytest.raises(TypeError, match=words):
        checkpoint.save_atomic({"x": value}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_a_body_that_is_not_plain_or_of_another_schema_is_refused(tmp_path):
    path = tmp_path / "c.pt"
    cases = [
        ({"schema": 2, "content": {"x": torch.Size([2])}}, "x is a Size, not plain data"),
        ({"schema": 3, "content": {}}, "schema 3: written by a newer r2ac"),
        ({"schema": "2", "content": {}}, "unknown schema '2'"),
        ({"schema": 2}, "no content"),
    ]
    for raw, words in cases:
        write_body(raw, path)
        with pytest.raises(checkpoint.CheckpointError, match=words) as info:
            checkpoint.load(path)
        assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("core", core_names(include_memoryless=True))
def test_every_core_state_round_trips_as_plain_data(tmp_path, core):
    """A state after a segment, written by its owner as plain data (no type named) and read
    back with the types of a fresh state of the same core: the same types, the same bits."""
    layer = make_core(core, 3, 4, dtype=torch.float64)
    with torch.no_grad():
        _, state = layer(torch.randn(5, 2, 3, dtype=torch.float64), layer.initial_state(2))
    path = checkpoint.save_atomic({"s": plain_state(state)}, tmp_path / "s.pt")
    saved = checkpoint.load(path)["s"]
    rebuilt = state_from_plain(saved, layer.initial_state(2))
    assert _types(rebuilt) == _types(state)
    leaves, theirs = pytree.tree_leaves(rebuilt), pytree.tree_leaves(state)
    assert len(leaves) == len(theirs)
    for a, b in zip(leaves, theirs, strict=True):
        assert (a is None and b is None) or (a.equal(b) and a.stride() == b.stride())


def _types(state):
    if isinstance(state, tuple):
        return (type(state), *map(_types, state))
    if isinstance(state, FlatTensors):
        return type(state)
    return type(state)


def test_a_name_where_a_state_is_expected_is_refused():
    like = ELSTMState(torch.ones(1, 2), None)
    forged = {"__r2ac_encoded__": "namedtuple", "type": "os:system", "fields": ["true"]}
    with pytest.raises(ValueError, match=r"s: a dict of the keys \('__r2ac_encoded__'"):
        state_from_plain(forged, like, "s")
    with pytest.raises(ValueError, match=r"s: a str, expected a dict of the fields \(c, sens\)"):
        state_from_plain("r2ac.rtrl.elstm.math:ELSTMState", like, "s")
    with pytest.raises(ValueError, match="s.sens: a list, expected None"):
        state_from_plain({"c": torch.ones(1, 2), "sens": [torch.ones(1)]}, like, "s")


def test_schema_1_bodies_are_converted_through_the_fixed_table(tmp_path):
    """A schema-1 body (tagged numpy values and NamedTuples) reads as today's plain data; a
    type name outside the table is refused, and nothing is imported for it."""
    tag = older_checkpoints.OLDER_TAG
    c, fz, wb = torch.ones(2, 3), torch.zeros(2, 2, 3, 4), torch.ones(2, 4, 3)
    sens = {tag: "carried", "type": "r2ac.rtrl.elstm_math:ELSTMSensitivity", "fields": [fz, wb]}
    raw = {
        "a": {tag: "ndarray", "data": torch.from_numpy(np.arange(3, dtype=np.uint32))},
        "b": {tag: "npscalar", "data": torch.tensor(2.5, dtype=torch.float64)},
        # ELSTMState by its module before the elstm package
        "s": {tag: "namedtuple", "type": "r2ac.rtrl.elstm_math:ELSTMState", "fields": [c, sens]},
    }
    loaded = checkpoint.load(write_body(raw, tmp_path / "old.pt"))
    assert loaded["a"].tolist() == [0, 1, 2] and loaded["b"] == 2.5
    assert set(loaded["s"]) == {"c", "sens"} and loaded["s"]["c"].equal(c)
    assert [t.shape for t in loaded["s"]["sens"]] == [fz.shape, wb.shape]
    for name in ("os:system", "r2ac.runs.locked_dir:platform.uname_result", 7):
        forged = {"x": {tag: "namedtuple", "type": name, "fields": []}}
        with pytest.raises(checkpoint.CheckpointError, match="refused type|malformed"):
            checkpoint.load(write_body(forged, tmp_path / "f.pt"))


def test_the_table_of_older_names_has_the_fields_of_the_types_today():
    """OLDER_TYPES holds names only (nothing is imported at load); each type still defined
    where its name says has the fields the table gives (carried sensitivities and UpdateStats
    are lists); the others are older names of these."""
    current = 0
    for name, fields in older_checkpoints.OLDER_TYPES.items():
        module, _, qualname = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), qualname)
        except (ImportError, AttributeError):
            continue  # a module's earlier name
        if cls.__module__ != module:
            continue  # re-exported by the package that replaced the module
        current += 1
        listed = issubclass(cls, FlatTensors) or qualname == "UpdateStats"
        assert fields == (None if listed else cls._fields), name
    assert current == 19
