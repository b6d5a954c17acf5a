"""`FlatTensors`: a value that flattens itself to tensors, so file formats need not know it.

A checkpoint stores such a value as the list of its `tensors()`, and its reader, holding a
value of the same class, rebuilds it with `from_tensors` (r2ac.rtrl.state.state_from_plain);
the object-store wire format (r2ac.rl.runtimes.wire) sends it with its class, in memory. The
eLSTM's sensitivities are one (r2ac.rtrl.elstm.deferred.CarriedBuffer).
"""

from __future__ import annotations

import torch


class FlatTensors:
    """Base of values that are a tuple of tensors with a class around them."""

    __slots__ = ()

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors that, given to `from_tensors` in this order, rebuild the value."""
        raise NotImplementedError

    @classmethod
    def from_tensors(cls, *tensors: torch.Tensor) -> FlatTensors:
        return cls(*tensors)
