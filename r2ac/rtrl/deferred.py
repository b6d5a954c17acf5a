"""Deferred, in-place sensitivity carries: the bookkeeping that keeps them safe.

Why (docs/rules/rtrl.md, "In-place carry"): the carry of a segment turns the sensitivities at
its start, S(t0), into those at its end; the backward of the same segment still needs S(t0)
(the history term d_hat(t0) . S(t0)). Done eagerly in forward, the carry must write a second
buffer of the O(B*N*D) state. Done at the end of that backward, it can overwrite S(t0): one
buffer instead of two, which stays in cache.

So a forward under autograd returns a state whose sensitivity tensors are *aliases* of the
input state's storage, with the carry still *pending*:

- the segment's backward runs the carry in place, if no other graph still needs S(t0);
- anything that reads the returned state first (the next forward, `advance_state`, the
  state helpers in r2ac.rtrl.state, `settle`) runs the pending carry out of place instead;
- after an in-place carry the input state is *consumed*: passing it to a layer again raises
  (its storage now holds the newer sensitivities).

Storage is tracked by tensor identity (aliases have their own version counters) and by storage
address for the readers, so nothing here holds a tensor alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakTensorKeyDictionary

_pending: WeakTensorKeyDictionary = WeakTensorKeyDictionary()  # alias -> PendingCarry
_consumed: WeakTensorKeyDictionary = WeakTensorKeyDictionary()  # tensor -> True
_readers: dict[int, weakref.WeakSet] = {}  # storage address -> tokens of graphs that read it


class ConsumedStateError(RuntimeError):
    """A state whose sensitivity buffers were overwritten by an in-place carry was reused."""


def alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor over t's storage (same sizes and strides) with its own version counter.

    Unlike a view, writing through t later (the in-place carry) does not count as modifying
    the alias, and re-pointing the alias (`set_`, the out-of-place carry) does not touch t.
    """
    out = t.new_empty(0)
    with torch.no_grad():
        out.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    return out


class PendingCarry:
    """A carry that has not run yet, from `sources` (the input state's sensitivity tensors) to
    `targets` (their aliases, held by the returned state).

    `out_of_place()` returns fresh tensors, at which the targets are re-pointed; `in_place()`
    writes the carry over the sources (the layer's backward calls it through `run_in_place`
    when `in_place_safe()`). Until the carry has run, it counts as a reader of the sources.
    """

    def __init__(
        self,
        sources: tuple[torch.Tensor, ...],
        out_of_place: Callable[[], tuple[torch.Tensor, ...]],
        in_place: Callable[..., Any],
    ):
        self.sources = sources
        self.targets = tuple(alias(s) for s in sources)
        self._out_of_place, self._in_place = out_of_place, in_place
        self.done = False
        self.token = register_reader(sources[0])
        for t in self.targets:
            _pending[t] = self

    def in_place_safe(self) -> bool:
        """Not run yet, and no live graph or other pending carry still reads the sources."""
        return not self.done and sole_reader(self.sources[0], self.token)

    def run_out_of_place(self) -> None:
        if self.done:
            return
        with torch.no_grad():
            for target, fresh in zip(self.targets, self._out_of_place(), strict=True):
                target.set_(fresh.untyped_storage(), fresh.storage_offset(), fresh.shape, fresh.stride())
        self._finish()

    def run_in_place(self, *args: Any) -> Any:
        """Write the carry over the sources (the targets alias them); the sources are consumed.

        Passes args to `in_place` and returns what it returns (the eLSTM's in-place carry also
        computes its segment's history gradient, in the same pass over the sources).
        """
        result = self._in_place(*args)
        mark_consumed(*self.sources)
        self._finish()
        return result

    def _finish(self) -> None:
        self.done = True
        self._out_of_place = self._in_place = None  # drop the segment's trace and inputs
        release_reader(self.sources[0], self.token)
        self.sources = ()
        for t in self.targets:
            _pending.pop(t, None)


def mark_consumed(*tensors: torch.Tensor) -> None:
    for t in tensors:
        _consumed[t] = True


def settle_tensor(t: torch.Tensor) -> None:
    """Run the pending carry that will fill t, if any; refuse a consumed tensor."""
    if t in _consumed:
        raise ConsumedStateError(
            "this state's sensitivities were overwritten in place by the carry of a segment that"
            " started from it (rule 'rtrl' under autograd); continue from the state that segment"
            " returned, or build the layer with inplace_carry=False to keep input states intact"
        )
    pending = _pending.get(t)
    if pending is not None:
        pending.run_out_of_place()


def settle(state: Any) -> Any:
    """The state with every pending carry in it run (returned for convenience)."""
    for leaf in pytree.tree_leaves(state):
        if isinstance(leaf, torch.Tensor):
            settle_tensor(leaf)
    return state


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class ReadToken:
    """Held by one autograd graph that will read a sensitivity buffer in its backward."""


def register_reader(t: torch.Tensor) -> ReadToken:
    token = ReadToken()
    _readers.setdefault(_storage_key(t), weakref.WeakSet()).add(token)
    return token


def release_reader(t: torch.Tensor, token: ReadToken) -> None:
    key = _storage_key(t)
    tokens = _readers.get(key)
    if tokens is not None:
        tokens.discard(token)
        if len(tokens) == 0:
            del _readers[key]


def sole_reader(t: torch.Tensor, token: ReadToken) -> bool:
    """True if no live graph or pending carry other than `token` still reads t's storage."""
    return all(other is token for other in _readers.get(_storage_key(t), ()))
