"""`RecurrentCore`: the one contract every core obeys (haiku's `hk.RNNCore` is the model).

    core = SomeCore(input_size=D, hidden_size=N, rule=...)
    state = core.initial_state(batch_size=B)             # a NamedTuple of (B, ...) tensors
    y, state = core(x, state, reset=reset, carry=True)   # x (T, B, D), reset (T, B) bool | None

A subclass writes `initial_state` and `forward` (and `state_tensors`, to have its state
checked); the checks of sizes, rules, inputs and states, and the defaults an actor relies on
(`light_state`, `act`, `carry_traces`, `advance_state`, `skips_carry`), are here. Code above
r2ac.rtrl (the agent, the actors) calls these methods and never looks inside a state or a
trace.

Acting with a light state and carrying the full one once per segment (docs/rules/rtrl.md,
"The actor's carry"):

    light = core.light_state(start)                       # no sensitivities
    for each step:  y, light, trace = core.act(x, light, reset=reset)   # no grad
    end = core.carry_traces(start, [trace, ...])          # full state, as forward would give it

The default trace keeps the inputs and `carry_traces` runs `advance_state` over them (one more
pass of the recurrence); a core whose steps already compute what its carry reads (the eLSTM,
RTU, LRU) keeps that in its traces instead and carries without re-running the recurrence.

Convention for cores that carry sensitivities (rules in `SENSITIVITY_RULES`): the state is a
NamedTuple with a field `sens`, None in a light state (acting under no_grad needs none).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from r2ac.rtrl.state import (
    cat_resets,
    check_rule,
    check_segment,
    check_state_tensor,
    write_state,
)

# (name, tensor, expected shape): one state tensor as `check_state` checks it
StateTensor = tuple[str, Tensor, tuple[int, ...]]


class InputTrace(NamedTuple):
    """The default trace of `act`: its inputs and the state it returned."""

    x: Tensor  # (T, B, D)
    reset: Tensor | None  # (T, B) bool
    state: Any  # the state after these steps


class RecurrentCore(nn.Module, metaclass=abc.ABCMeta):
    """Base of every core: `(x (T, B, D), state, reset) -> (y (T, B, N), state)`.

    Class attributes a subclass sets: `RULES` (the rules it implements) and `State` (its state
    NamedTuple). Attributes every core has: `input_size` D, `hidden_size` N, `rule`.
    """

    RULES: ClassVar[tuple[str, ...]] = ("bptt",)
    SENSITIVITY_RULES: ClassVar[tuple[str, ...]] = ("rtrl", "snap1")
    State: ClassVar[type] = NamedTuple
    # forward(carry=False) skips the sensitivity carry (returns sens=None): an IMPALA learner
    # discards the state it gets back, so it need not pay for it. Cores that cannot skip it
    # accept the argument and return their full state.
    skips_carry: ClassVar[bool] = False
    # Implements `recurrent_snapshot` and `first_order_start` (with a sensitivity rule).
    has_first_order_start: ClassVar[bool] = False
    # `carry_traces(..., weights=carry_weights())` may run after the parameters have moved:
    # its traces and those weights, taken when acting, are all it reads. The serial runtime's
    # actors then carry after the learner's update, in place (Actor, `defer_carry`).
    defers_carry: ClassVar[bool] = False
    # Set by `without_history` only: the forward then adds no history term.
    _history_off: bool = False

    def __init__(self, input_size: int, hidden_size: int, rule: str):
        super().__init__()
        name = type(self).__name__
        if input_size < 1 or hidden_size < 1:
            raise ValueError(f"{name}: sizes must be positive, got D={input_size}, N={hidden_size}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.rule = check_rule(rule, self.RULES, name)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, rule={self.rule!r}"

    @property
    def carries_sensitivities(self) -> bool:
        """Whether the state carries sensitivities (exact or approximate RTRL)."""
        return self.rule in self.SENSITIVITY_RULES

    @property
    def exact_gradient(self) -> bool:
        """Whether `loss.backward()` gives an exact gradient: of full BPTT through the stream's
        history for a sensitivity rule, of BPTT truncated at segment starts for "bptt". A core
        whose rule approximates (feLSTM's SnAp-1) says False; the contract suite
        (tests/rtrl/test_contract.py) checks the claim against the slow reference."""
        return True

    # -- what a core writes

    @abc.abstractmethod
    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None) -> Any:
        """Zero state of `batch_size` streams; `with_sensitivities=False` gives a light state."""

    @abc.abstractmethod
    def forward(
        self, x: Tensor, state: Any, reset: Tensor | None = None, carry: bool = True
    ) -> tuple[Tensor, Any]:
        """y (T, B, N) and the state after the segment (detached; see `skips_carry`)."""

    def state_tensors(self, state: Any, batch_size: int) -> list[StateTensor]:
        """The state's tensors with the shapes they must have (checked by `check_state`)."""
        return []

    # -- defaults a core may specialise

    def light_state(self, state: Any) -> Any:
        """What acting under no_grad needs: the state without its sensitivities, or `state`
        itself (the same object) when there is nothing to drop."""
        if self.carries_sensitivities and state.sens is not None:
            return state._replace(sens=None)
        return state

    def advance_state(self, x: Tensor, state: Any, reset: Tensor | None = None) -> Any:
        """The state after the segment, as `forward` returns it, without gradients (a core may
        skip computing its outputs here)."""
        with torch.no_grad():
            return self(x, state, reset=reset)[1]

    def act(self, x: Tensor, state: Any, reset: Tensor | None = None) -> tuple[Tensor, Any, Any]:
        """Acting without gradients from `light_state(start)` (or from what the last `act`
        returned): y (T, B, N), the state after these steps (light, as the one given) and a
        trace for `carry_traces`, which reads it with the same parameters."""
        with torch.no_grad():
            y, new = self(x, state, reset=reset)
        return y, new, InputTrace(x, reset, new)

    def carry_traces(self, state: Any, traces: Sequence[Any], out: Any = None) -> Any:
        """The full state after the steps of `traces` (from `act`, in order, acted from
        `light_state(state)`), from the full state `state` before them, which is left intact:
        what `advance_state` over the same inputs returns, to rounding.

        `out`: a full state of the same streams, not sharing memory with `state` (a core with
        `defers_carry` also takes `state` itself: a carry in place), to hold the result (its
        tensors are overwritten and it is returned): an actor that carries into a slice of its
        runtime's batch buffer spares the join of the actors' states. A core may write there
        directly (the eLSTM's native carry); the default copies."""
        if self.light_state(state) is state:  # nothing was dropped: the steps carried it
            return write_state(out, traces[-1].state)
        xs = [t.x for t in traces]
        reset = cat_resets([t.reset for t in traces], xs)  # (T, B) or None
        return write_state(out, self.advance_state(torch.cat(xs), state, reset=reset))

    def carry_weights(self) -> Any:
        """Copies of the parameters `carry_traces` reads, for a core with `defers_carry`."""
        raise NotImplementedError(f"{type(self).__name__} carries at once (defers_carry False)")

    @contextlib.contextmanager
    def without_history(self) -> Iterator[None]:
        """Inside, a sensitivity rule's forward adds no history term and accepts a light
        state: the gradient is BPTT truncated at the segment start, what rule "bptt" gives
        (the diagnostics' split of a gradient into its in-segment part and its history term).
        Applies to every core inside this one."""
        cores = [m for m in self.modules() if isinstance(m, RecurrentCore)]
        for core in cores:
            core._history_off = True
        try:
            yield
        finally:
            for core in cores:
                core._history_off = False

    def project_(self) -> None:
        """Put the parameters back in their domain after an optimiser step (in place; the
        gradient is untouched). No constraint by default; the RTU and LRU bound their phase
        (`pair_math.phase_log_bound`). `project_cores_` calls it on every core of a model."""

    def recurrent_snapshot(self) -> Any:
        """Detached copies of the parameters the sensitivities differentiate, for
        `first_order_start` (cores with `has_first_order_start`)."""
        raise NotImplementedError(f"{type(self).__name__} has no first-order start state")

    def first_order_start(self, state: Any, snapshot: Any) -> Any:
        """`state` with its recurrent state moved to first order by the parameters' change
        since `snapshot`: s(t0) + S(t0) . (theta - theta_snapshot), the sensitivities kept. A
        learner that steps several times from one stored start state (PPO's epochs) gives
        each later pass the start state its current weights would have reached, to first
        order (docs/rules/passes.md, "First-order start state"); a light state is returned
        as it is."""
        raise NotImplementedError(f"{type(self).__name__} has no first-order start state")

    # -- shared checks

    def _reference_tensor(self) -> Tensor:
        """A parameter: its dtype and device are the ones inputs and states must have."""
        return next(self.parameters())

    def check_input(self, x: Tensor, reset: Tensor | None) -> tuple[int, int]:
        """Check x (T, B, D) and reset (T, B) bool; return (T, B)."""
        return check_segment(
            x, reset, self.input_size, self._reference_tensor(), type(self).__name__
        )

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"{type(self).__name__}: batch_size must be >= 1, got {batch_size}")

    def wants_sensitivities(self, batch_size: int, with_sensitivities: bool | None) -> bool:
        """For `initial_state`: checks batch_size; None means "if the rule carries them"."""
        self.check_batch_size(batch_size)
        return self.carries_sensitivities if with_sensitivities is None else with_sensitivities

    def check_state(self, state: Any, batch_size: int) -> None:
        """The state's type, and each tensor's shape, dtype and device."""
        name = type(self).__name__
        if not isinstance(state, self.State):
            article = "an" if self.State.__name__[0] in "AEFHILMNORSX" else "a"
            raise TypeError(
                f"{name}: state must be {article} {self.State.__name__}, got {type(state).__name__}"
            )
        ref = self._reference_tensor()
        for field, tensor, shape in self.state_tensors(state, batch_size):
            check_state_tensor(field, tensor, shape, ref, name)

    def tracks_history(self, state: Any) -> bool:
        """Whether this forward adds the history term (a sensitivity rule under autograd);
        refuses a light state then, since the gradient would be silently truncated."""
        if self._history_off or not (self.carries_sensitivities and torch.is_grad_enabled()):
            return False
        if state.sens is None:
            name = type(self).__name__
            raise ValueError(
                f"{name}(rule={self.rule!r}): the state carries no sensitivities, so the gradient"
                " would be silently truncated; start from initial_state() (light states are for"
                " no_grad acting)"
            )
        return True


def project_cores_(module: nn.Module) -> None:
    """`project_` every recurrent core inside `module` (after each optimiser step)."""
    for m in module.modules():
        if isinstance(m, RecurrentCore):
            m.project_()
