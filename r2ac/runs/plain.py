"""Plain data: what a checkpoint holds, and numpy values in and out of it.

Plain data is tensors, None, booleans, integers, floats and strings, in lists, tuples and dicts
(string or integer keys; a module's state_dict is an OrderedDict). It names no type: whoever
writes a value of another type (a NamedTuple, a numpy array) writes it in plain form, and its
reader, knowing the type it wants, rebuilds it (e.g. r2ac.rtrl.state.plain_state and
state_from_plain for the core states).

`from_numpy` and `to_numpy` are the two halves of that for the numpy values of env and RNG
states: arrays stored as tensors, read back as arrays by the code that gave them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

SCALARS = (bool, int, float, str, type(None))
MAX_REPORT = 80  # characters of a path or type named in a message


def problem(obj: Any, where: str = "") -> str | None:
    """The first place where `obj` is not plain data, in words; None if it is all plain."""
    stack = [(obj, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor and type(value) is not torch.nn.Parameter:
                return _not_plain(value, at)
            continue
        if type(value) in SCALARS:
            continue
        if type(value) in (list, tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(value))
        elif type(value) in (dict, OrderedDict):
            extra = vars(value) if type(value) is OrderedDict else {}  # a state_dict's versions
            if set(extra) - {"_metadata"}:
                return f"{at or 'the file'} has attributes {sorted(extra)[:4]}, not plain data"
            if "_metadata" in extra:
                stack.append((extra["_metadata"], f"{at}._metadata" if at else "_metadata"))
            for key, v in value.items():
                if type(key) not in (str, int):
                    return f"{at or 'the file'} has a key of type {type(key).__name__[:MAX_REPORT]}"
                stack.append((v, f"{at}.{key}" if at else str(key)))
        else:
            return _not_plain(value, at)
    return None


def _not_plain(value: Any, at: str) -> str:
    kind = type(value).__name__[:MAX_REPORT]
    return f"{(at or 'the file')[:MAX_REPORT]} is a {kind}, not plain data"


def from_numpy(tree: Any) -> Any:
    """`tree` with every numpy array a tensor (a copy) and every numpy scalar a Python number;
    dicts, lists and tuples rebuilt, anything else as it is."""
    if isinstance(tree, np.generic):  # first: np.float64 is also a Python float
        return tree.item()
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree).copy())
    if isinstance(tree, dict):
        return {k: from_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(from_numpy(v) for v in tree)
    return tree


def to_numpy(tree: Any) -> Any:
    """The inverse of `from_numpy` for a tree that held arrays: every tensor a numpy array
    (sharing its memory). TypeError for a tensor numpy cannot hold."""
    if isinstance(tree, torch.Tensor):
        try:
            return tree.detach().cpu().numpy()
        except (TypeError, RuntimeError) as exc:  # e.g. a dtype numpy lacks
            raise TypeError(f"a {tree.dtype} tensor where an array was saved ({exc})") from None
    if isinstance(tree, dict):
        return {k: to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_numpy(v) for v in tree)
    return tree
