"""Slow reference implementations, written straight from the equations, for gradient checks.

Each reference is a plain step-by-step loop of differentiable torch ops: autograd through it
is full BPTT over whatever history it is given. They take parameters as a dict so that the
gradient-check harness can compare them with any layer that uses the same parameter names.

    reference(params, x (T, B, D), reset (T, B) bool, state0 | None) -> (y (T, B, N), state_T)

Kept in the package (not in tests/) because later cores, the demo command and users who add
their own cores all check against them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def elstm_reference(
    params: dict[str, Tensor], x: Tensor, reset: Tensor, c0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """eLSTM of SPEC.md section 1, one step at a time."""
    F, Z, O, W_o = params["F"], params["Z"], params["O"], params["W_o"]
    w_f, w_z, b_f, b_z, b_o = (params[k] for k in ("w_f", "w_z", "b_f", "b_z", "b_o"))
    T, B, _ = x.shape
    c = x.new_zeros(B, F.shape[0]) if c0 is None else c0
    hs = []
    for t in range(T):
        c = torch.where(reset[t, :, None], torch.zeros_like(c), c)
        f = torch.sigmoid(x[t] @ F.T + w_f * c + b_f)
        z = torch.tanh(x[t] @ Z.T + w_z * c + b_z)
        c = f * c + (1 - f) * z
        o = torch.sigmoid(x[t] @ O.T + c @ W_o.T + b_o)
        hs.append(o * c)
    return torch.stack(hs), c
