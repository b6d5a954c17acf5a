"""The values of a loaded checkpoint, checked against what the loader built, before any is used.

`r2ac.runs.schema` checks a loaded checkpoint's structure (which keys, which kinds of value);
this module checks that its values fit the model, optimiser and actors the run's config builds:
shapes, dtypes, finiteness, tensors that own their data (no expanded views whose size is a lie),
numbers where numbers belong. Each function raises `ValueMismatch` (a ConfigError) naming the
first misfit, e.g. ``actors[0].state.h: shape (3, 8), expected (3, 16)``; the loader adds the
file's name. All of it runs once, at load time: training itself never pays for it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from r2ac.errors import ConfigError
from r2ac.flat import FlatTensors


class ValueMismatch(ConfigError):
    """A loaded value that does not fit what the loader built."""


def _at(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _shape(t) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ")"


def check_tensor(value: Any, where: str, like: torch.Tensor | None = None) -> None:
    """`value` is a tensor that owns plain, dense data (no expanded or overlapping view), of
    `like`'s shape and dtype when given, finite if it holds floats, never complex unless
    `like` is."""
    if not isinstance(value, torch.Tensor):
        raise ValueMismatch(f"{where}: {type(value).__name__}, expected a tensor")
    if value.layout != torch.strided:
        raise ValueMismatch(f"{where}: a {value.layout} tensor, expected a dense one")
    if value.is_complex() and not (like is not None and like.is_complex()):
        raise ValueMismatch(f"{where}: complex values ({value.dtype}), expected real ones")
    if _is_view_of_less(value) or (
        not value.is_contiguous() and (like is None or like.is_contiguous())
    ):
        raise ValueMismatch(
            f"{where}: a non-contiguous view of shape {_shape(value)} (strides "
            f"{tuple(value.stride())}), expected a tensor that holds its own data"
        )
    if like is not None:
        if tuple(value.shape) != tuple(like.shape):
            raise ValueMismatch(f"{where}: shape {_shape(value)}, expected {_shape(like)}")
        if value.dtype != like.dtype:
            raise ValueMismatch(f"{where}: dtype {value.dtype}, expected {like.dtype}")
    if (value.is_floating_point() or value.is_complex()) and value.numel():
        if not bool(torch.isfinite(value).all()):
            raise ValueMismatch(f"{where}: holds non-finite values (NaN or infinity)")


def _is_view_of_less(t: torch.Tensor) -> bool:
    """An expanded or overlapping view: more elements than its storage holds (a 4 x 10^11
    view of one float), which any operation on it would materialise."""
    if t.numel() <= 1:
        return False
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        return True
    return t.untyped_storage().nbytes() < t.numel() * t.element_size()


def check_weights(saved: dict, reference: dict, where: str = "") -> None:
    """A state_dict against the model's own (`reference`): every entry both hold is a dense
    finite tensor of the model's shape and dtype (missing or extra names are left to
    `load_state_dict`, which names them)."""
    for name, ref in reference.items():
        if name in saved and isinstance(ref, torch.Tensor):
            check_tensor(saved[name], _at(where, name), ref)
    for name, value in saved.items():  # an extra entry is refused later; a bad one here
        if name not in reference:
            check_tensor(value, _at(where, name))


def check_like(saved: Any, reference: Any, where: str) -> None:
    """`saved` has the form of `reference` (a value of the same kind this process built):
    tensors and arrays of its shape and dtype, containers of its length, numbers where it
    has numbers (finite); a `None` in `reference` accepts anything (unknown here). Keys of
    a dict that only one side holds are left to the code that reads them."""
    if reference is None:
        return
    if isinstance(reference, torch.Tensor):
        check_tensor(saved, where, reference)
    elif isinstance(reference, np.ndarray):
        _check_array(saved, where, reference)
    elif isinstance(reference, (FlatTensors, dict, list, tuple)):
        _check_container(saved, where, reference)
    else:
        _check_scalar(saved, where, reference)


def _check_container(saved: Any, where: str, reference: Any) -> None:
    if isinstance(reference, FlatTensors):
        if type(saved) is not type(reference):
            raise ValueMismatch(
                f"{where}: {type(saved).__name__}, expected {type(reference).__name__}"
            )
        check_like(list(saved.tensors()), list(reference.tensors()), where)
    elif isinstance(reference, dict):
        if not isinstance(saved, dict):
            raise ValueMismatch(f"{where}: {type(saved).__name__}, expected a dict")
        for key, ref in reference.items():
            if key in saved:
                check_like(saved[key], ref, _at(where, key))
    else:
        _check_sequence(saved, where, reference)


def _check_scalar(saved: Any, where: str, reference: Any) -> None:
    if isinstance(reference, (bool, np.bool_)):
        if not isinstance(saved, (bool, np.bool_)):
            raise ValueMismatch(f"{where}: {_kind(saved)}, expected a boolean")
    elif isinstance(reference, (int, float, np.number)):
        _check_number(saved, where, integer=isinstance(reference, (int, np.integer)))
    elif isinstance(reference, str) and not isinstance(saved, str):
        raise ValueMismatch(f"{where}: {_kind(saved)}, expected a string")


def _check_sequence(saved: Any, where: str, reference: list | tuple) -> None:
    if not isinstance(saved, (list, tuple)):
        raise ValueMismatch(f"{where}: {_kind(saved)}, expected a sequence")
    if hasattr(reference, "_fields") and type(saved) is not type(reference):
        raise ValueMismatch(f"{where}: {type(saved).__name__}, expected {type(reference).__name__}")
    if len(saved) != len(reference):
        raise ValueMismatch(f"{where}: {len(saved)} entries, expected {len(reference)}")
    names = getattr(reference, "_fields", range(len(reference)))
    for name, s, r in zip(names, saved, reference, strict=True):
        check_like(s, r, f"{where}.{name}" if isinstance(name, str) else f"{where}[{name}]")


def _check_array(saved: Any, where: str, reference: np.ndarray) -> None:
    if not isinstance(saved, np.ndarray):
        raise ValueMismatch(f"{where}: {_kind(saved)}, expected an array")
    if saved.shape != reference.shape or saved.dtype != reference.dtype:
        raise ValueMismatch(
            f"{where}: array {saved.dtype}{list(saved.shape)}, expected "
            f"{reference.dtype}{list(reference.shape)}"
        )
    if not saved.flags.c_contiguous:
        raise ValueMismatch(f"{where}: a non-contiguous array view")
    if saved.dtype.kind in "fc" and saved.size and not np.isfinite(saved).all():
        raise ValueMismatch(f"{where}: holds non-finite values (NaN or infinity)")


def _kind(value: Any) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return f"{type(value).__name__} {value!r}"[:60]
    return type(value).__name__


def _check_number(saved: Any, where: str, integer: bool) -> None:
    if isinstance(saved, torch.Tensor) and saved.numel() == 1 and not saved.is_complex():
        saved = saved.item()
    ok = (
        isinstance(saved, (int, np.integer))
        if integer
        else isinstance(saved, (int, float, np.integer, np.floating))
    )
    if not ok or isinstance(saved, bool):
        raise ValueMismatch(
            f"{where}: {_kind(saved)}, expected {'an integer' if integer else 'a number'}"
        )
    if not integer and not math.isfinite(float(saved)):
        raise ValueMismatch(f"{where}: {saved!r}, expected a finite number")


def check_count(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    """An integer counter in low..high."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueMismatch(f"{where}: {_kind(value)}, expected an integer")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high:,}" if high is not None else f">= {low}"
        raise ValueMismatch(f"{where}: {value:,}, expected {bound}")
    return value


def check_optimizer(saved: dict, optimizer: torch.optim.Optimizer, where: str) -> None:
    """An optimiser's state_dict against `optimizer` (built for the model the config gives):
    as many groups and parameters, hyperparameters of the same kinds, each parameter's state
    tensors dense, finite and of its parameter's shape (or scalars, such as Adam's step)."""
    params = _optimizer_params(saved["param_groups"], optimizer, where)
    for pid, entry in saved["state"].items():
        here = f"{where}.state[{pid!r}]"
        if pid not in params:
            raise ValueMismatch(f"{here}: no such parameter")
        if not isinstance(entry, dict):
            raise ValueMismatch(f"{here}: {_kind(entry)}, expected a dict")
        for key, value in entry.items():
            _check_param_state(value, params[pid], f"{here}.{key}")


def _optimizer_params(groups: list, optimizer: torch.optim.Optimizer, where: str) -> dict:
    """The saved parameter indices -> the optimiser's parameters, after checking the groups."""
    ref_groups = optimizer.state_dict()["param_groups"]
    if len(groups) != len(ref_groups):
        raise ValueMismatch(
            f"{where}.param_groups: {len(groups)} groups, expected {len(ref_groups)}"
        )
    own = iter([p for g in optimizer.param_groups for p in g["params"]])
    params: dict[Any, torch.Tensor] = {}
    for i, (group, ref) in enumerate(zip(groups, ref_groups, strict=True)):
        here = f"{where}.param_groups[{i}]"
        ids = group.get("params")
        if not isinstance(ids, (list, tuple)) or len(ids) != len(ref["params"]):
            count = len(ids) if isinstance(ids, (list, tuple)) else _kind(ids)
            raise ValueMismatch(f"{here}.params: {count} parameters, expected {len(ref['params'])}")
        for key, value in ref.items():
            if key != "params" and key in group:
                check_like(group[key], value, f"{here}.{key}")
        for pid in ids:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid in params:
                raise ValueMismatch(f"{here}.params: {_kind(pid)} is not a new parameter index")
            params[pid] = next(own)
    return params


def _check_param_state(value: Any, param: torch.Tensor, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, torch.Tensor):
        _check_number(value, where, integer=False)
        return
    check_tensor(value, where)
    if value.dim() and tuple(value.shape) != tuple(param.shape):
        raise ValueMismatch(
            f"{where}: shape {_shape(value)}, expected {_shape(param)} (its parameter's)"
        )
    if value.dim() and value.dtype != param.dtype:
        raise ValueMismatch(f"{where}: dtype {value.dtype}, expected {param.dtype}")
