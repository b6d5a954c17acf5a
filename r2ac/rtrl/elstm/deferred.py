"""Deferred, in-place sensitivity carries: the state's buffers own the bookkeeping.

Why (docs/rules/rtrl.md, "In-place carry"): the carry of a segment turns the sensitivities at
its start, S(t0), into those at its end; the backward of the same segment still needs S(t0)
(the history term d_hat(t0) . S(t0)). Done eagerly in forward, the carry must write a second
buffer of the O(B*N*D) state. Done at the end of that backward, it can overwrite S(t0): one
buffer instead of two, which stays in cache.

A core keeps its sensitivities in a `CarriedBuffer` (the eLSTM's `ELSTMSensitivity`). A forward
under autograd returns a *pending* buffer: it holds the carry that will fill it, and nothing
else yet. Whatever happens first decides where the carry runs:

- the segment's backward runs it in place over S(t0), when nothing else reads S(t0) any more
  (no other live graph, no other pending carry) and the pending buffer is still alive; the
  buffer then holds S(t0)'s own tensors, and the buffer of S(t0) is *consumed*;
- any read of the pending buffer before that (its tensors, iterating it, a pytree helper,
  pickling) runs the carry out of place, into new tensors.

Everything lives on the buffers: a buffer knows its tensors (or its pending carry), whether it
was consumed, and the graphs and carries that will still read it (weakly: a graph dropped
without a backward takes its claim with it). Nothing is global, and nothing outlives the
states and graphs that hold it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from r2ac.flat import FlatTensors


class ConsumedStateError(RuntimeError):
    """A state whose sensitivity buffers were overwritten by an in-place carry was reused."""


CONSUMED_MESSAGE = (
    "this state's sensitivities were overwritten in place by the carry of a segment that"
    " started from it (rule 'rtrl' under autograd); continue from the state that segment"
    " returned, or build the layer with inplace_carry=False to keep input states intact"
)


class ReadToken:
    """Held by one autograd graph (or one pending carry) that will still read a buffer."""

    __slots__ = ("__weakref__",)


class CarriedBuffer(FlatTensors):
    """The tensors of a carried sensitivity state, and the bookkeeping of its in-place carry.

    A subclass names its tensors with properties (see `ELSTMSensitivity`) and is registered as
    a pytree node, so the state helpers (r2ac.rtrl.state) and torch's pytree functions see its
    tensors. Every read goes through `tensors()`, which runs a pending carry first and refuses
    a consumed buffer (ConsumedStateError).
    """

    __slots__ = ("_tensors", "_pending", "_consumed", "_readers", "__weakref__")

    def __init__(self, *tensors: torch.Tensor):
        self._tensors: tuple[torch.Tensor, ...] | None = tensors
        self._pending: PendingCarry | None = None
        self._consumed = False
        self._readers = weakref.WeakSet()  # tokens of the graphs and carries that read it

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        pytree.register_pytree_node(
            cls,
            lambda buf: (list(buf.tensors()), buf._readers),
            cls._derived,
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        )

    @classmethod
    def _derived(cls, tensors, readers: weakref.WeakSet) -> CarriedBuffer:
        """A buffer made by a pytree map of another (`detach_state`, `select_streams`, ...).

        Its tensors may share the other's storage (a detach, a slice), so the two share their
        readers: a graph reading one keeps the other's carry from writing over it in place.
        Where the storage is new (a copy, a concatenation) that only forgoes an in-place carry.
        """
        buf = cls(*tensors)
        buf._readers = readers
        return buf

    @classmethod
    def deferred(cls, carry: PendingCarry) -> CarriedBuffer:
        """A buffer that `carry` will fill (in the backward, or out of place on first read)."""
        buf = cls.__new__(cls)
        CarriedBuffer.__init__(buf)
        buf._tensors, buf._pending = None, carry
        carry.bind(buf)
        return buf

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors, after running a pending carry; raises ConsumedStateError if consumed."""
        if self._consumed:
            raise ConsumedStateError(CONSUMED_MESSAGE)
        if self._pending is not None:
            self._pending.run_out_of_place()
        return self._tensors

    @property
    def consumed(self) -> bool:
        return self._consumed

    @property
    def is_pending(self) -> bool:
        return self._pending is not None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.tensors())

    def __len__(self) -> int:
        return len(self.tensors())

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tensors()[i]

    def __reduce__(self):
        return type(self), tuple(self.tensors())

    def __repr__(self) -> str:
        if self._consumed or self._pending is not None:
            return f"{type(self).__name__}({'consumed' if self._consumed else 'pending'})"
        shapes = ", ".join(str(tuple(t.shape)) for t in self._tensors)
        return f"{type(self).__name__}({shapes})"

    # -- readers: graphs and pending carries that will read this buffer's current tensors

    def add_reader(self) -> ReadToken:
        token = ReadToken()
        self._readers.add(token)
        return token

    def release_reader(self, token: ReadToken) -> None:
        self._readers.discard(token)

    def reader_count(self) -> int:
        return len(self._readers)

    def sole_reader(self, token: ReadToken) -> bool:
        """True if no live graph or pending carry other than `token` still reads this buffer."""
        return all(other is token for other in self._readers)

    def _fill(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self._tensors, self._pending = tuple(tensors), None

    def _consume(self) -> tuple[torch.Tensor, ...]:
        """Hand over the tensors (just overwritten in place) and refuse any later read.

        Their version counters are bumped, so that a second backward through a graph that
        saved them (`retain_graph=True`) raises autograd's "modified by an inplace operation"
        even when a native kernel wrote them through raw pointers.
        """
        tensors = self._tensors
        torch.autograd.graph.increment_version(list(tensors))
        self._tensors, self._consumed = None, True
        return tensors


class PendingCarry:
    """A carry from `source` (a buffer, its tensors read but not written) that has not run yet.

    `out_of_place()` returns new tensors; `in_place(*args)` writes the carry over the source's
    tensors and returns what the caller's backward needs (the eLSTM's fused kernel also computes
    the segment's history gradient in the same pass). Until it has run, the carry counts as a
    reader of the source, so another carry cannot overwrite what it still needs.
    """

    def __init__(
        self,
        source: CarriedBuffer,
        out_of_place: Callable[[], CarriedBuffer | tuple[torch.Tensor, ...]],
        in_place: Callable[..., Any],
    ):
        self.source: CarriedBuffer | None = source
        self.token = source.add_reader()
        self._out_of_place, self._in_place = out_of_place, in_place
        self._target: weakref.ref | None = None  # weak: a dropped state needs no carry

    def bind(self, target: CarriedBuffer) -> None:
        self._target = weakref.ref(target)

    @property
    def done(self) -> bool:
        return self.source is None

    def in_place_safe(self) -> bool:
        """Not run yet, its target still wanted, and nothing else still reads the source."""
        target = None if self._target is None else self._target()
        return not self.done and target is not None and self.source.sole_reader(self.token)

    def run_out_of_place(self) -> None:
        if self.done:
            return
        with torch.no_grad():
            fresh = tuple(self._out_of_place())
        self._target()._fill(fresh)
        self._finish()

    def run_in_place(self, *args: Any) -> Any:
        """Write the carry over the source's tensors, which the target then holds; the source is
        consumed. Call only when `in_place_safe()`."""
        target = self._target()
        result = self._in_place(*args)
        target._fill(self.source._consume())
        self._finish()
        return result

    def _finish(self) -> None:
        self.source.release_reader(self.token)
        self.source = None
        self._out_of_place = self._in_place = None  # drop the segment's trace and inputs
