"""Segments and weights as numpy trees, for Ray's object store (zero-copy on the way out).

Ray stores numpy arrays out of band (pickle protocol 5) and `ray.get` returns read-only views
of the shared-memory object store instead of copies; torch tensors would be pickled as bytes
and copied. `pack` turns a tree of tensors (NamedTuples such as `Segment` and the core
states, `FlatTensors` such as the eLSTM's sensitivities, tuples, lists, dicts, None) into
the same tree of numpy arrays; `unpack` is its inverse and shares memory with what it is given.

A tensor that is a permuted view of a dense block (the eLSTM keeps FZ (B, 2, N, D) as a
view of a (B, D, 2, N) block) travels as that block plus the permutation, so that neither
side copies it into another layout and the learner sees the actor's layout.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from r2ac.flat import FlatTensors


@dataclass(frozen=True)
class PackedTensor:
    """A tensor as a C-contiguous array and the permutation that gives back its dims."""

    array: np.ndarray
    dims: tuple[int, ...] | None  # None: the array has the tensor's own dim order


@dataclass(frozen=True)
class PackedBuffer:
    """A `FlatTensors` value (class `kind`) as its packed tensors."""

    kind: type
    tensors: tuple[PackedTensor, ...]


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


def pack_tensor(t: torch.Tensor) -> PackedTensor:
    """No copy for a CPU tensor that is contiguous or a permuted dense block."""
    t = t.detach().cpu()
    order = dense_order(t)
    base = t if order is None else t.permute(order)
    array = np.ascontiguousarray(base.numpy())  # copies only a tensor with gaps
    return PackedTensor(array, None if order is None else _inverse(order))


def unpack_tensor(p: PackedTensor) -> torch.Tensor:
    """A tensor on `p.array`'s memory (read-only when Ray handed it out: copy before writing)."""
    with warnings.catch_warnings():  # torch warns about read-only arrays; nothing writes them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = torch.from_numpy(p.array)
    return t if p.dims is None else t.permute(p.dims)


def pack(tree: Any) -> Any:
    """`tree` with every tensor packed (see the module docstring)."""
    if isinstance(tree, torch.Tensor):
        return pack_tensor(tree)
    if isinstance(tree, FlatTensors):  # reading it runs a pending carry
        return PackedBuffer(type(tree), tuple(pack_tensor(t) for t in tree.tensors()))
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(pack(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(pack(v) for v in tree)
    if isinstance(tree, dict):
        return {k: pack(v) for k, v in tree.items()}
    return tree


def unpack(tree: Any) -> Any:
    """Inverse of `pack`; the tensors share the arrays' memory."""
    if isinstance(tree, PackedTensor):
        return unpack_tensor(tree)
    if isinstance(tree, PackedBuffer):
        return tree.kind.from_tensors(*(unpack_tensor(p) for p in tree.tensors))
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(unpack(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(unpack(v) for v in tree)
    if isinstance(tree, dict):
        return {k: unpack(v) for k, v in tree.items()}
    return tree


def arrays(tree: Any) -> list[np.ndarray]:
    """The arrays of a packed tree, in order."""
    if isinstance(tree, PackedTensor):
        return [tree.array]
    if isinstance(tree, PackedBuffer):
        return [p.array for p in tree.tensors]
    if isinstance(tree, (list, tuple)):
        return [a for v in tree for a in arrays(v)]
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in arrays(v)]
    return []


def nbytes(tree: Any) -> int:
    """Bytes of the arrays in a packed tree (what the object store holds for it)."""
    return sum(a.nbytes for a in arrays(tree))
