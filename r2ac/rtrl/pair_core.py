"""`PairCore`: what the diagonal complex cores (RTU, LRU) share about their state.

Their state is one pair tensor (B, 2, N) (real and imaginary parts, or c1 and c2) and, under
rule "rtrl", a `PairSensitivity` with C stored input maps (B, C, 2, N, D) and M per-unit
vectors (B, M, 2, N). A subclass sets `pair_field` (its state's first field name, for
messages) and, in `__init__`, `pair_units` N, `stored_maps` C and `vector_count` M; and
`_outputs` (its forward pass), `_attach_history` (its history gradient) and
`_carry_sensitivities` (its segment carry), from which `forward`, the acting step (`act`)
and the carry from its traces (`carry_traces`) are built here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.core import RecurrentCore, StateTensor
from r2ac.rtrl.state import cat_resets, keep_mask, write_state


class PairTrace(NamedTuple):
    """What `PairCore.act` keeps for `carry_traces`: what the steps computed and the carry reads."""

    x: Tensor  # (T, B, D)
    reset: Tensor | None  # (T, B) bool
    cp: Tensor  # (T, B, 2, N) the previous pairs, reset-masked
    u: Tensor  # (T, B, 2, N) the input maps' outputs [W1 x; W2 x]
    a: Tensor | None  # (T, B, 2, N) pre-activations, for a non-linear recurrence only
    last: Tensor  # (B, 2, N) the pairs after the last step


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

    def project_(self) -> None:
        """The phase stays in (0, max_phase] (`pair_math.phase_log_bound`: why)."""
        pm.clamp_phase_(self.theta_log, self.ring[2])

    def state_tensors(self, state: Any, B: int) -> list[StateTensor]:
        N, D = self.pair_units, self.input_size
        tensors = [(self.pair_field, state[0], (B, 2, N))]
        if state.sens is not None:
            tensors += [
                ("sens.W", state.sens.W, (B, self.stored_maps, 2, N, D)),
                ("sens.v", state.sens.v, (B, self.vector_count, 2, N)),
            ]
        return tensors

    def forward(
        self, x: Tensor, state: Any, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, Any]:
        """x (T, B, D), reset (T, B) bool or None -> y (T, B, hidden_size), state at the
        segment end. carry=False returns a state without sensitivities (for a caller that
        drops it)."""
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        keep = keep_mask(reset, x.dtype)  # (T, B, 1) or None
        pair0 = state[0].detach()
        if self.tracks_history(state):
            pair0 = self._attach_history(pair0, state.sens)
        y, pairs, cp, a, u = self._outputs(x, pair0, keep)
        new_sens = None
        if self.rule == "rtrl" and state.sens is not None and carry:
            with torch.no_grad():
                new_sens = self._carry_sensitivities(state.sens, x, cp, u, a, keep)
        return y, self.State(pairs[-1].detach(), new_sens)

    def _attach_history(self, pair0: Tensor, sens: pm.PairSensitivity) -> Tensor:
        """pair0 unchanged in value, with a backward that adds the history gradient
        dL/dpair0 . S to the parameters (the subclass's `_HistoryGradient`)."""
        raise NotImplementedError

    def _outputs(
        self, x: Tensor, pair0: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
        """The forward pass: y (T, B, hidden_size), and the pairs s, cp, a (None for a linear
        recurrence) and u, (T, B, 2, N) each."""
        raise NotImplementedError

    def _carry_sensitivities(
        self,
        sens: pm.PairSensitivity,
        x: Tensor,
        cp: Tensor,
        u: Tensor,
        a: Tensor | None,
        keep: Tensor | None,
    ) -> pm.PairSensitivity:
        """S at the end of a segment from S at its start (no grad), as in `PairTrace`."""
        raise NotImplementedError

    @torch.no_grad()
    def act(
        self, x: Tensor, state: Any, reset: Tensor | None = None
    ) -> tuple[Tensor, Any, PairTrace]:
        """y (T, B, hidden_size) as `forward` gives it, the light state after the steps, and
        what they computed for `carry_traces` (which then re-runs no recurrence)."""
        T, B = self.check_input(x, reset)
        self.check_state(state, B)
        keep = keep_mask(reset, x.dtype)  # (T, B, 1) or None
        y, pairs, cp, a, u = self._outputs(x, state[0], keep)
        return y, self.State(pairs[-1], None), PairTrace(x, reset, cp, u, a, pairs[-1])

    @torch.no_grad()
    def carry_traces(self, state: Any, traces: Sequence[PairTrace], out: Any = None) -> Any:
        """The state after the acted steps, with the sensitivities carried from `state`'s over
        the steps' traces (one segment carry); `out` as in `RecurrentCore.carry_traces`."""
        last = traces[-1].last
        if not (self.carries_sensitivities and state.sens is not None):
            return write_state(out, self.State(last, None))
        xs = [t.x for t in traces]
        cp, u = (torch.cat([getattr(t, k) for t in traces]) for k in ("cp", "u"))
        a = None if traces[0].a is None else torch.cat([t.a for t in traces])
        x = torch.cat(xs)  # (T, B, D)
        keep = keep_mask(cat_resets([t.reset for t in traces], xs), x.dtype)  # (T, B, 1) | None
        sens = self._carry_sensitivities(state.sens, x, cp, u, a, keep)
        return write_state(out, self.State(last, sens))
