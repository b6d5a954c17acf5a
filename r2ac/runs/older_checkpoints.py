"""Checkpoints written before schema 2, read into schema 2's plain data (r2ac.runs.plain).

Two older kinds:

- schema 1 (the R2AC-CHECKPOINT framing, a body without a "schema" key): numpy values and
  the core states were stored as tagged dicts, ``{TAG: "ndarray" | "npscalar", "data":
  tensor}`` and ``{TAG: "namedtuple" | "carried", "type": "module:Class", "fields": [...]}``;
- a bare ``torch.save`` (before the framing): numpy arrays and NamedTuples pickled as such.
  Torch's weights-only unpickler reads it, with a fixed list of stand-ins added: numpy's
  array and scalar constructors, and for each name in OLDER_TYPES a tuple that keeps its
  fields. A file naming anything else is refused by the unpickler.

Either becomes the plain form the owners write today: an array its tensor, a numpy scalar a
Python number, a NamedTuple a dict of its fields, a carried sensitivity (and the copy task's
UpdateStats) the list of its fields. A type name is only ever looked up in OLDER_TYPES, the
fixed table of the names older versions wrote (their modules as they were then): nothing is
imported by a name from a file, and a name not in the table is refused.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from r2ac.errors import ConfigError

OLDER_TAG = "__r2ac_encoded__"

_ELSTM_TRACE = ("x", "reset", "gates", "c")
_RECURRENCE_TRACE = ("fh", "zh", "a", "cp")
_GATE_TRACE = ("f", "z", "cp")
# The state types older checkpoints name, by the names they gave them, and the fields of each
# one's plain form (a dict of them); None: a list of its fields in order.
OLDER_TYPES: dict[str, tuple[str, ...] | None] = {
    "r2ac.rtrl.elstm.math:ELSTMState": ("c", "sens"),
    "r2ac.rtrl.elstm.math:ELSTMSensitivity": None,
    "r2ac.rtrl.elstm.math:RecurrenceTrace": _RECURRENCE_TRACE,
    "r2ac.rtrl.elstm.math:GateTrace": _GATE_TRACE,
    "r2ac.rtrl.elstm.layer:ELSTMTrace": _ELSTM_TRACE,
    # the same before r2ac/rtrl/elstm/ was a package
    "r2ac.rtrl.elstm_math:ELSTMState": ("c", "sens"),
    "r2ac.rtrl.elstm_math:ELSTMSensitivity": None,
    "r2ac.rtrl.elstm_math:RecurrenceTrace": _RECURRENCE_TRACE,
    "r2ac.rtrl.elstm_math:GateTrace": _GATE_TRACE,
    "r2ac.rtrl.elstm:ELSTMTrace": _ELSTM_TRACE,
    "r2ac.rtrl.rtu:RTUState": ("c", "sens"),
    "r2ac.rtrl.lstm:LSTMState": ("h", "c"),
    "r2ac.rtrl.gru:GRUState": ("h",),
    "r2ac.rtrl.lru:LRUState": ("h", "sens"),
    "r2ac.rtrl.elman:ElmanState": ("h", "sens"),
    "r2ac.rtrl.felstm:FeLSTMState": ("c", "sens"),
    "r2ac.rtrl.felstm:FeLSTMSensitivity": ("M", "b"),
    "r2ac.rtrl.fwp:FWPState": ("W", "sens"),
    "r2ac.rtrl.fwp:FWPSensitivity": ("Kh", "Vh"),
    "r2ac.rtrl.feedforward:FeedforwardState": (),
    "r2ac.rl.nets:FeedforwardState": (),  # before the core registry
    "r2ac.rtrl.pair_math:PairSensitivity": ("W", "v"),
    "r2ac.rtrl.pair_core:PairTrace": ("x", "reset", "cp", "u", "a", "last"),
    "r2ac.rtrl.core:InputTrace": ("x", "reset", "state"),
    "r2ac.tasks.copy.schedules:UpdateStats": None,  # a list, as the copy task writes it now
}


def _refuse(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where or 'the file'}: {message}")


def _plain_of(name: Any, fields: list, where: str) -> Any:
    """The plain form of the state type `name` with these (already converted) fields."""
    if not isinstance(name, str) or name not in OLDER_TYPES:
        raise _refuse(
            where, f"refused type {str(name)[:80]!r} (not a state type older checkpoints hold)"
        )
    names = OLDER_TYPES[name]
    if names is None:
        return list(fields)
    if len(fields) != len(names):
        raise _refuse(where, f"{name} with {len(fields)} fields, expected {len(names)}")
    return dict(zip(names, fields, strict=True))


# --- schema 1: tagged dicts ----------------------------------------------------------------


def from_schema_1(obj: Any, where: str = "") -> Any:
    """A schema-1 body in plain form (ConfigError naming the place of a malformed or unknown
    tagged entry)."""
    if isinstance(obj, dict):
        if OLDER_TAG in obj and all(isinstance(k, str) for k in obj):
            return _from_tagged(obj, where)
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            out[key] = from_schema_1(value, f"{where}.{key}" if where else str(key))
        if getattr(obj, "_metadata", None) is not None:  # a module state_dict's versions
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if type(obj) in (list, tuple):
        return type(obj)(from_schema_1(v, f"{where}[{i}]") for i, v in enumerate(obj))
    return obj


def _from_tagged(obj: dict, where: str) -> Any:
    kind = obj[OLDER_TAG]
    if kind in ("ndarray", "npscalar"):
        data = obj.get("data")
        if not isinstance(data, torch.Tensor):
            raise _refuse(where, f"malformed {kind} entry: its data is {type(data).__name__}")
        if kind == "ndarray":
            return data
        if data.numel() != 1:
            raise _refuse(where, f"malformed npscalar entry: {data.numel()} values")
        return data.item()
    if kind not in ("namedtuple", "carried"):
        raise _refuse(where, f"unknown tag {str(kind)[:40]!r}")
    name, fields = obj.get("type"), obj.get("fields")
    if not isinstance(name, str) or not isinstance(fields, list):
        raise _refuse(
            where,
            f"malformed {kind} entry: type {type(name).__name__}, fields "
            f"{type(fields).__name__} (expected a string and a list)",
        )
    if name not in OLDER_TYPES:  # before converting what it holds
        _plain_of(name, fields, where)
    return _plain_of(name, [from_schema_1(v, f"{where}.{i}") for i, v in enumerate(fields)], where)


# --- bare torch.save files: the weights-only unpickler with stand-ins ------------------------


class OlderState(tuple):
    """A state type of an older bare pickle, as its fields; `name` is its key in OLDER_TYPES.
    Built by the unpickler (NamedTuples are pickled as a class and its fields, carried
    sensitivities as a class called with their tensors), so it takes its fields as arguments."""

    name = ""

    def __new__(cls, *fields):
        return super().__new__(cls, fields)


def _stand_ins() -> list:
    """The globals a bare pickle of an older checkpoint may name, each with the name it has
    there: numpy's array and scalar constructors and dtypes, and a stand-in per OLDER_TYPES
    entry."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 pickles numpy._core, numpy 1 numpy.core
    core = core.multiarray
    found: list = [np.ndarray, np.dtype]
    found += [type(np.dtype(c)) for c in "?bhilqBHILQefdg"]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found += [(core._reconstruct, f"{module}._reconstruct"), (core.scalar, f"{module}.scalar")]
    for name in OLDER_TYPES:
        module, _, qualname = name.partition(":")
        stand_in = type(qualname, (OlderState,), {"name": name, "__slots__": ()})
        found.append((stand_in, f"{module}.{qualname}"))
    return found


def load_bare(source, map_location) -> Any:
    """A bare torch.save file read weights-only, with the stand-ins of `_stand_ins` (a torch
    before 2.6, which cannot give a global another name, reads only a bare file of data)."""
    try:
        allowed = torch.serialization.safe_globals(_stand_ins())
    except (AttributeError, TypeError):
        allowed = contextlib.nullcontext()
    with allowed:
        return torch.load(source, map_location=map_location, weights_only=True)


def from_objects(obj: Any, where: str = "") -> Any:
    """A bare pickle's content (`load_bare`) in plain form."""
    if isinstance(obj, OlderState):
        fields = [from_objects(v, f"{where}.{i}") for i, v in enumerate(obj)]
        return _plain_of(type(obj).name, fields, where)
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise _refuse(where, "an array of Python objects, not data")
        return torch.from_numpy(np.ascontiguousarray(obj).copy())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            out[key] = from_objects(value, f"{where}.{key}" if where else str(key))
        if getattr(obj, "_metadata", None) is not None:
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if type(obj) in (list, tuple):
        return type(obj)(from_objects(v, f"{where}[{i}]") for i, v in enumerate(obj))
    return obj
