"""`PairCore`: what the diagonal complex cores (RTU, LRU) share about their state.

Their state is one pair tensor (B, 2, N) (real and imaginary parts, or c1 and c2) and, under
rule "rtrl", a `PairSensitivity` with C stored input maps (B, C, 2, N, D) and M per-unit
vectors (B, M, 2, N). A subclass sets `pair_field` (its state's first field name, for
messages) and, in `__init__`, `pair_units` N, `stored_maps` C and `vector_count` M.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.core import RecurrentCore, StateTensor


class PairCore(RecurrentCore):
    RULES = ("bptt", "rtrl")
    skips_carry = True  # carry=False returns sens=None (an IMPALA learner drops the state)
    pair_field: ClassVar[str] = "c"
    pair_units: int
    stored_maps: int
    vector_count: int

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> Any:
        """Zero state; for rule "rtrl" with zero sensitivities (`with_sensitivities=False`: light)."""
        with_sensitivities = self.wants_sensitivities(batch_size, with_sensitivities)
        ref = self._reference_tensor()
        kw = {"device": ref.device, "dtype": ref.dtype}
        pair = torch.zeros(batch_size, 2, self.pair_units, **kw)  # (B, 2, N)
        if not with_sensitivities:
            return self.State(pair, None)
        sens = pm.zero_sensitivity(
            batch_size, self.stored_maps, self.vector_count, self.pair_units, self.input_size, **kw
        )
        return self.State(pair, sens)

    def state_tensors(self, state: Any, B: int) -> list[StateTensor]:
        N, D = self.pair_units, self.input_size
        tensors = [(self.pair_field, state[0], (B, 2, N))]
        if state.sens is not None:
            tensors += [
                ("sens.W", state.sens.W, (B, self.stored_maps, 2, N, D)),
                ("sens.v", state.sens.v, (B, self.vector_count, 2, N)),
            ]
        return tensors
