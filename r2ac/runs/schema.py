"""What a loaded checkpoint must hold, checked before a loader touches it.

A checkpoint with a correct checksum may still hold anything a weights-only unpickler can
build (``{}``, a list, ``{"agent": "hello"}``): `problem(obj, spec)` compares it with the
structure its loader expects and names the first difference, so the loader can refuse it with
one line instead of failing somewhere inside with a traceback.

A spec is
    a type or a tuple of types     ``isinstance`` (``int`` excludes ``bool``)
    a dict {key: spec}             a dict with those keys (``Opt(spec)`` for an optional one;
                                   other keys are allowed)
    ``MapOf(spec)``                a dict with string keys and values of ``spec``
    ``ListOf(spec)``               a list or tuple of ``spec``
    ``OneOf(spec, ...)``           any of them
    ``object``                     anything
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Opt:
    spec: Any


@dataclass(frozen=True)
class MapOf:
    value: Any


@dataclass(frozen=True)
class ListOf:
    item: Any


class OneOf:
    def __init__(self, *specs: Any):
        self.specs = specs


NUMBER = (int, float)
STATE_DICT = MapOf(torch.Tensor)  # a module's state_dict: names -> tensors
OPTIMIZER = {"state": dict, "param_groups": ListOf(dict)}


def describe(spec: Any) -> str:
    """The spec in words: `a tensor`, `a dict with keys a, b`, ..."""
    names = {torch.Tensor: "a tensor", dict: "a dict", list: "a list", tuple: "a tuple"}
    names |= {int: "an integer", float: "a number", str: "a string", type(None): "None"}
    if isinstance(spec, tuple):
        return " or ".join(describe(s) for s in spec)
    if isinstance(spec, type):
        return names.get(spec, f"a {spec.__name__}")
    if isinstance(spec, dict):
        keys = [k for k, v in spec.items() if not isinstance(v, Opt)]
        return f"a dict with keys {', '.join(map(repr, keys))}" if keys else "a dict"
    if isinstance(spec, MapOf):
        if spec.value is torch.Tensor:
            return "a state_dict (a dict of names to tensors)"
        return f"a dict of names to values each {describe(spec.value)}"
    if isinstance(spec, ListOf):
        return f"a list of {describe(spec.item)}"
    if isinstance(spec, OneOf):
        return " or ".join(describe(s) for s in spec.specs)
    return "anything"


def _got(obj: Any) -> str:
    if isinstance(obj, (str, int, float)):
        return f"{type(obj).__name__} {obj!r}"[:60]
    return type(obj).__name__


def _is(obj: Any, types: type | tuple) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(obj, bool) and bool not in types and object not in types:
        return False
    return isinstance(obj, types)


def problem(obj: Any, spec: Any, where: str = "") -> str | None:
    """The first place where `obj` does not fit `spec`, in words; None if it fits."""
    if spec is object:
        return None
    if isinstance(spec, (type, tuple)):
        return None if _is(obj, spec) else _mismatch(obj, spec, where)
    if isinstance(spec, OneOf):
        if any(problem(obj, s, where) is None for s in spec.specs):
            return None
        return _mismatch(obj, spec, where)
    if isinstance(spec, ListOf):
        if not isinstance(obj, (list, tuple)):
            return _mismatch(obj, spec, where)
        return _first(problem(v, spec.item, f"{where}[{i}]") for i, v in enumerate(obj))
    if not isinstance(obj, dict):
        return _mismatch(obj, spec, where)
    if isinstance(spec, MapOf):
        bad = [k for k in obj if not isinstance(k, str)]
        if bad:
            return f"{where or 'the file'} has a key {bad[0]!r} that is not a name"
        return _first(problem(v, spec.value, _at(where, k)) for k, v in obj.items())
    return _dict_problem(obj, spec, where)


def _dict_problem(obj: dict, spec: dict, where: str) -> str | None:
    for key, sub in spec.items():
        optional = isinstance(sub, Opt)
        if key not in obj:
            if optional:
                continue
            return f"{where or 'the file'} has no {key!r} entry"
        found = problem(obj[key], sub.spec if optional else sub, _at(where, key))
        if found:
            return found
    return None


def _at(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _first(found) -> str | None:
    return next((p for p in found if p is not None), None)


def _mismatch(obj: Any, spec: Any, where: str) -> str:
    return f"{where or 'the file'} should be {describe(spec)}, not {_got(obj)}"


# An agent's weights file (agent.pt: eval, --load-stem): {"agent": state_dict}, or a bare
# state_dict (a foreign or pre-trained one)
WEIGHTS_FILE = OneOf({"agent": STATE_DICT}, STATE_DICT)
