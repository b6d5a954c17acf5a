"""Segments and weights as plain trees of numpy arrays, for Ray's object store (zero-copy on the
way out).

Ray stores numpy arrays out of band (pickle protocol 5) and `ray.get` returns read-only views
of the shared-memory object store instead of copies; torch tensors would be pickled as bytes
and copied. `pack` turns a tree of tensors (NamedTuples such as `Segment` and the core
states, `FlatTensors` such as the eLSTM's sensitivities, tuples, lists, dicts, None) into
plain data: every node a tuple whose first item says what it is, and arrays::

    ("tensor", array, dims)   dims: the permutation back to the tensor's dims, or None
    ("kind", NAME, [items])   a NamedTuple or FlatTensors of the project's, NAME in KINDS
    ("list", [items]), ("tuple", [items]), ("dict", {key: item}), None, numbers, strings

No class crosses the wire (a pickled class is imported by its receiver: code named by the
sender): the receiver rebuilds each kind from its own fixed table, `KINDS`, and refuses any
other node in one line (`WireError`). `unpack` is `pack`'s inverse and shares memory with
what it is given.

A tensor that is a permuted view of a dense block (the eLSTM keeps FZ (B, 2, N, D) as a
view of a (B, D, 2, N) block) travels as that block plus the permutation, so that neither
side copies it into another layout and the learner sees the actor's layout.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, NamedTuple

import numpy as np
import torch

from r2ac.flat import FlatTensors

# The modules whose NamedTuples and FlatTensors may travel in a segment: the segment itself
# and the core states with their sensitivities and traces (r2ac/rtrl/).
KIND_MODULES = (
    "r2ac.rl.learning.actor",
    "r2ac.rtrl.core",
    "r2ac.rtrl.pair_core",
    "r2ac.rtrl.pair_math",
    "r2ac.rtrl.rtu",
    "r2ac.rtrl.lru",
    "r2ac.rtrl.elman",
    "r2ac.rtrl.gru",
    "r2ac.rtrl.lstm",
    "r2ac.rtrl.mingru",
    "r2ac.rtrl.felstm",
    "r2ac.rtrl.fwp",
    "r2ac.rtrl.feedforward",
    "r2ac.rtrl.elstm.math",
    "r2ac.rtrl.elstm.layer",
    "r2ac.rtrl.elstm.deferred",
    "r2ac.rtrl.stacked.base",
)


class WireError(ValueError):
    """A packed tree that is not what `pack` makes (an unknown kind or node)."""


class PackedTensor(NamedTuple):
    """A packed tensor, as unpacked from ("tensor", array, dims): for `unpack_tensor`."""

    array: np.ndarray
    dims: tuple[int, ...] | None  # None: the array has the tensor's own dim order


def _own_kinds() -> dict[str, type]:
    """NAME -> class of every NamedTuple and FlatTensors defined in KIND_MODULES."""
    table: dict[str, type] = {}
    for name in KIND_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if not isinstance(value, type) or value.__module__ != name:
                continue
            if issubclass(value, FlatTensors) or (
                issubclass(value, tuple) and hasattr(value, "_fields")
            ):
                if table.setdefault(value.__qualname__, value) is not value:
                    raise RuntimeError(f"two kinds named {value.__qualname__} in KIND_MODULES")
    return table


_KINDS: dict[str, type] | None = None
_NAMES: dict[type, str] = {}


def kinds() -> dict[str, type]:
    """The fixed table (built once, from KIND_MODULES)."""
    global _KINDS, _NAMES
    if _KINDS is None:
        _KINDS = _own_kinds()
        _NAMES = {cls: name for name, cls in _KINDS.items()}
    return _KINDS


def dense_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """A permutation `p` with `t.permute(p)` contiguous, or None when `t` is contiguous (or
    is no permutation of a dense block)."""
    if t.is_contiguous() or t.dim() < 2:
        return None
    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    return order if t.permute(order).is_contiguous() else None


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def pack_tensor(t: torch.Tensor) -> tuple:
    """("tensor", array, dims); no copy for a CPU tensor that is contiguous or a permuted
    dense block."""
    t = t.detach().cpu()
    order = dense_order(t)
    base = t if order is None else t.permute(order)
    array = np.ascontiguousarray(base.numpy())  # copies only a tensor with gaps
    return ("tensor", array, None if order is None else _inverse(order))


def unpack_tensor(p: PackedTensor) -> torch.Tensor:
    """A tensor on `p.array`'s memory (read-only when Ray handed it out: copy before writing)."""
    with warnings.catch_warnings():  # torch warns about read-only arrays; nothing writes them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = torch.from_numpy(p.array)
    return t if p.dims is None else t.permute(p.dims)


def _kind_name(cls: type) -> str:
    kinds()
    name = _NAMES.get(cls)
    if name is None:
        raise TypeError(f"wire: {cls.__module__}.{cls.__qualname__} is not a kind of KINDS")
    return name


def pack(tree: Any) -> Any:
    """`tree` as plain data (see the module docstring)."""
    if isinstance(tree, torch.Tensor):
        return pack_tensor(tree)
    if isinstance(tree, FlatTensors):  # reading it runs a pending carry
        return ("kind", _kind_name(type(tree)), [pack_tensor(t) for t in tree.tensors()])
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return ("kind", _kind_name(type(tree)), [pack(v) for v in tree])
    if isinstance(tree, list):
        return ("list", [pack(v) for v in tree])
    if isinstance(tree, tuple):
        return ("tuple", [pack(v) for v in tree])
    if isinstance(tree, dict):
        return ("dict", {k: pack(v) for k, v in tree.items()})
    if tree is None or type(tree) in (bool, int, float, str):
        return tree
    raise TypeError(f"wire: cannot send a {type(tree).__name__}")


def _items(node: tuple, where: str) -> list:
    if len(node) < 2 or not isinstance(node[-1], list):
        raise WireError(f"{where}: a malformed {node[0]!r} node")
    return node[-1]


def unpack(tree: Any, where: str = "segment") -> Any:
    """Inverse of `pack`; the tensors share the arrays' memory. WireError for anything that
    `pack` does not make, such as a kind outside KINDS."""
    if tree is None or type(tree) in (bool, int, float, str):
        return tree
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        raise WireError(f"{where}: a {type(tree).__name__}, not a packed node")
    tag = tree[0]
    if tag == "tensor":
        if len(tree) != 3 or type(tree[1]) is not np.ndarray:
            raise WireError(f"{where}: a malformed tensor")
        dims = tree[2]
        if dims is not None and not (
            isinstance(dims, tuple) and sorted(dims) == list(range(tree[1].ndim))
        ):
            raise WireError(f"{where}: a tensor with a bad permutation {dims!r:.60}")
        return unpack_tensor(PackedTensor(tree[1], dims))
    if tag == "kind":
        name = tree[1] if len(tree) == 3 else None
        cls = kinds().get(name) if isinstance(name, str) else None
        if cls is None:
            raise WireError(f"{where}: unknown kind {str(name)[:60]!r} (not one of r2ac's)")
        values = [unpack(v, f"{where}.{name}") for v in _items(tree, where)]
        if issubclass(cls, FlatTensors):
            return cls.from_tensors(*values)
        if len(values) != len(cls._fields):
            raise WireError(f"{where}: {name} with {len(values)} fields, not {len(cls._fields)}")
        return cls(*values)
    if tag in ("list", "tuple") and len(tree) == 2:
        values = [unpack(v, where) for v in _items(tree, where)]
        return values if tag == "list" else tuple(values)
    if tag == "dict" and len(tree) == 2 and isinstance(tree[1], dict):
        return {k: unpack(v, f"{where}.{k}") for k, v in tree[1].items()}
    raise WireError(f"{where}: unknown node {tag[:40]!r}")


def field(packed: Any, name: str) -> Any:
    """A field of a packed NamedTuple (e.g. a segment's "state"), still packed."""
    return packed[2][kinds()[packed[1]]._fields.index(name)]


def arrays(tree: Any) -> list[np.ndarray]:
    """The arrays of a packed tree, in order."""
    if isinstance(tree, tuple) and tree and tree[0] == "tensor":
        return [tree[1]]
    if isinstance(tree, tuple) and tree and tree[0] in ("kind", "list", "tuple", "dict"):
        items = tree[-1].values() if tree[0] == "dict" else tree[-1]
        return [a for v in items for a in arrays(v)]
    return []


def nbytes(tree: Any) -> int:
    """Bytes of the arrays in a packed tree (what the object store holds for it)."""
    return sum(a.nbytes for a in arrays(tree))
