"""`FlatTensors`: a value that flattens itself to tensors, so file formats need not know it.

The checkpoint format (r2ac.runs.checkpoint) and the object-store wire format
(r2ac.rl.runtimes.wire) store such a value as its class name and `tensors()`, and rebuild it
with `from_tensors`; neither imports the class (the eLSTM's sensitivities are one:
r2ac.rtrl.elstm.deferred.CarriedBuffer).
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
