"""The eLSTM's history term and in-place carry on CUDA: fused candidates, chosen by measurement.

Two operations of a segment's backward read the O(B*N*D) sensitivities FZ (docs/rules/rtrl.md,
"GPU carry"):

    history(d_hat, sens)                              d_hat(t0) . S(t0), the history term
    history_and_carry_in_place(d_hat, sens, trace, x) the same, then the carry over S(t0)

On the CPU both are elstm_math's (the native C kernel in float32, PyTorch otherwise). On CUDA
each runs one of these candidates, with the same arguments and results:

    torch    elstm_math's PyTorch path: a loop over streams, a scale and a GEMM (five passes
             over FZ for the carry)
    compile  torch.compile of `fused_history` / `fused_history_and_carry` below: the same math
             written for the compiler (no Python loop over streams or steps)
    triton   r2ac.rtrl.elstm.gpu_triton, one read and one write of FZ; only where triton imports
    compile-graph, triton-graph
             that candidate replayed as a CUDA graph (`Graphed`): at small B the compiled
             carry is bound by its launches and guards (~0.5 ms a call on an H200 whatever
             the size), which a replay skips; it copies FZ in (and for the
             carry back out), so it only pays where launches cost more than those copies

`R2AC_GPU_CARRY=auto` (the default) tries each available candidate once per operation, dtype
and shape, on copies of the real operands: it checks the result against the torch path
(relative error under 1e-10 in float64, 1e-4 in float32), times a few calls and keeps the
fastest. `R2AC_GPU_CARRY=compile|triton|torch` asks for one (still checked first). A
candidate that fails or disagrees is dropped with one warning per candidate, and the torch
path runs instead. `selections()` tells what was chosen and what each candidate took.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from r2ac.errors import ConfigError
from r2ac.perf import time_alternating
from r2ac.rtrl.elstm import math as em
from r2ac.rtrl.elstm.carry_math import carry_inputs, wb_increment
from r2ac.rtrl.elstm.math import ELSTMSensitivity, RecurrenceTrace

ENV = "R2AC_GPU_CARRY"
CHOICES = ("auto", "compile", "triton", "compile-graph", "triton-graph", "torch")
# tried before the torch path, which is always measured
AUTO_ORDER = ("triton", "compile", "triton-graph", "compile-graph")
GRAPHED = {"compile-graph": "compile", "triton-graph": "triton"}  # candidate -> what it replays
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}  # ||candidate - torch|| / ||torch||
TRIAL_REPEATS = 5  # timed calls per candidate in a selection (median)
OPS = ("history", "carry")


# -- the math, written for the compiler (and used eagerly by the Triton candidate) ------------


def fused_history(stored: Tensor, wb: Tensor, d_hat: Tensor) -> tuple[Tensor, Tensor]:
    """The history term from FZ's storage blocks stored (B, D, 2, N), wb (B, 4, N) and
    d_hat (B, N): dL/d[F; Z] (2, N, D) and dL/d(w_f, w_z, b_f, b_z) (4, N)."""
    hist = (stored * d_hat[:, None, None, :]).sum(0)  # (D, 2, N), one reduction over streams
    return hist.permute(1, 2, 0), (wb * d_hat[:, None, :]).sum(0)


def fused_history_and_carry(
    stored: Tensor, wb: Tensor, fh: Tensor, zh: Tensor, a: Tensor, cp: Tensor, x: Tensor,
    d_hat: Tensor,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`fused_history`, then stored and wb overwritten with their values at the segment's end:
    FZ = G * FZ + sum_tau outer(u(tau), x(tau)) (elstm_math's module docstring).

    fh, zh, a, cp: (T, B, N) the segment's trace; x: (T, B, D).
    """
    T, B, N = fh.shape
    D = x.shape[-1]
    hist, d_wb = fused_history(stored, wb, d_hat)  # before stored changes
    u, G = carry_inputs(fh, zh, a)  # (T, B, 2, N), (B, N)
    # Per stream: (D, T) @ (T, 2N) -> (D, 2N), the layout of FZ's storage blocks.
    outer = torch.bmm(x.permute(1, 2, 0), u.reshape(T, B, 2 * N).transpose(0, 1))
    stored.mul_(G[:, None, None, :]).add_(outer.view(B, D, 2, N))
    wb.mul_(G[:, None, :]).add_(wb_increment(u, cp))
    return hist, d_wb


# -- candidates: name -> op -> callable(stored, wb, [fh, zh, a, cp, x,] d_hat) -----------------


def _fz(stored: Tensor) -> Tensor:
    return stored.permute(0, 2, 3, 1)  # storage blocks (B, D, 2, N) -> FZ (B, 2, N, D)


def _torch_history(stored: Tensor, wb: Tensor, d_hat: Tensor) -> tuple[Tensor, Tensor]:
    return em.inject_gradients(d_hat, ELSTMSensitivity(_fz(stored), wb))


def _torch_carry(stored, wb, fh, zh, a, cp, x, d_hat) -> tuple[Tensor, Tensor]:
    sens = ELSTMSensitivity(_fz(stored), wb)
    return em.history_and_carry_in_place(d_hat, sens, RecurrenceTrace(fh, zh, a, cp), x)


_compiled: dict[str, Callable] = {}
RECOMPILE_LIMIT = 64  # graphs per function: dtypes x (T = 1, T = 2, T >= 3) x coincident sizes


def _compile_candidate(op: str) -> Callable:
    """The compiled function of `op`. Dynamic shapes: one graph serves every size except T = 1
    and T = 2 (which specialise); called without autograd (so grad mode never recompiles it)
    and with room for more graphs than dynamo's default limit of 8, past which it would fail."""
    if op not in _compiled:
        fn = fused_history if op == "history" else fused_history_and_carry
        compiled = torch.compile(fn, fullgraph=True, dynamic=True)
        config = torch._dynamo.config

        def call(*args: Tensor) -> tuple[Tensor, Tensor]:
            with torch.no_grad(), config.patch(recompile_limit=RECOMPILE_LIMIT):
                return compiled(*args)

        _compiled[op] = call
    return _compiled[op]


def _triton_candidate(op: str) -> Callable:
    from r2ac.rtrl.elstm import gpu_triton  # imports triton

    return gpu_triton.history if op == "history" else gpu_triton.history_and_carry


def signature(args: Sequence[Tensor]) -> tuple:
    """What a selection (and a CUDA graph) is made for: each operand's shape, strides, dtype
    and device."""
    return tuple((t.shape, t.stride(), t.dtype, t.device) for t in args)


class Graphed:
    """Candidate `base` of `op` replayed as a CUDA graph, one graph per operand signature.

    The graph is captured on static copies of the first call's operands (after two warm-up
    calls on a side stream, so that compilation and autotuning stay out of the capture). A
    call copies its operands into them, replays, copies the carry's overwritten stored and wb
    back, and returns clones of the two gradients (the next replay overwrites the static
    ones). The same kernels on the same values as `base`, so the same numbers."""

    def __init__(self, op: str, base: str):
        self.op, self.base = op, base
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[Tensor], Sequence[Tensor]]] = {}

    def __call__(self, *args: Tensor) -> tuple[Tensor, Tensor]:
        key = signature(args)
        if key not in self.graphs:
            self.graphs[key] = self._capture(args)
        graph, static, out = self.graphs[key]
        for target, source in zip(static, args, strict=True):
            target.copy_(source)
        graph.replay()
        if self.op == "carry":  # the carry overwrites stored and wb in place
            args[0].copy_(static[0])
            args[1].copy_(static[1])
        return out[0].clone(), out[1].clone()

    def forget(self, args: Sequence[Tensor]) -> None:
        """Free the graph (and its static copies) of this signature."""
        self.graphs.pop(signature(args), None)

    def _capture(self, args: Sequence[Tensor]):
        fn = CANDIDATES[self.base](self.op)
        static = _clones(args)
        side = torch.cuda.Stream(args[0].device)
        side.wait_stream(torch.cuda.current_stream(args[0].device))
        with torch.cuda.stream(side):
            for _ in range(2):  # compile / autotune / load kernels before the capture
                fn(*static)
        torch.cuda.current_stream(args[0].device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls during the capture (a runtime's batch
        # transfers) are not the capture's business and must not fail it
        with torch.no_grad(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = fn(*static)
        return graph, static, out


_graphed: dict[tuple[str, str], Graphed] = {}  # (candidate, op) -> its graphs


def _graph_candidate(name: str) -> Callable[[str], Callable]:
    def make(op: str) -> Graphed:
        if (name, op) not in _graphed:
            _graphed[name, op] = Graphed(op, GRAPHED[name])
        return _graphed[name, op]

    return make


CANDIDATES: dict[str, Callable[[str], Callable]] = {
    "torch": lambda op: _torch_history if op == "history" else _torch_carry,
    "compile": _compile_candidate,
    "triton": _triton_candidate,
    **{name: _graph_candidate(name) for name in GRAPHED},
}


def unavailable(name: str, device: torch.device) -> str | None:
    """Why candidate `name` cannot run on `device`, or None if it can (a capability check)."""
    if name in GRAPHED:
        if device.type != "cuda":
            return "CUDA graphs need a CUDA device"
        return unavailable(GRAPHED[name], device)
    if name == "triton":
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return "triton runs on CUDA only (or under TRITON_INTERPRET=1)"
    return None


# -- selection ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The candidate chosen for one operation and operand signature, and why."""

    op: str
    shapes: tuple[tuple[int, ...], ...]  # of stored, wb[, fh, zh, a, cp, x], d_hat
    dtype: str
    device: str
    name: str
    ms: dict[str, float] = field(default_factory=dict)  # auto: median ms per candidate
    failed: dict[str, str] = field(default_factory=dict)  # warned and dropped
    unavailable: dict[str, str] = field(default_factory=dict)  # not tried (auto: silent)


_selected: dict[tuple, Selection] = {}
_warned: set[str] = set()


def requested() -> str:
    """$R2AC_GPU_CARRY (auto, compile, triton or torch); ConfigError for anything else."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ConfigError(f"{ENV}={choice!r}: choose one of {', '.join(CHOICES)}")
    return choice


def selections() -> list[Selection]:
    """Every selection made in this process, in order."""
    return list(_selected.values())


def reset() -> None:
    """Forget the selections, warnings and CUDA graphs (the next call selects again)."""
    _selected.clear()
    _warned.clear()
    _graphed.clear()


def run(op: str, *args: Tensor) -> tuple[Tensor, Tensor]:
    """`op` ("history" or "carry") by the candidate selected for these operands' signature
    (selected on first use); the arguments are those of `fused_history` or
    `fused_history_and_carry`."""
    key = (op, *signature(args))
    selection = _selected.get(key)
    if selection is None:
        selection = _selected[key] = select(op, args, requested())
    return CANDIDATES[selection.name](op)(*args)


def select(op: str, args: Sequence[Tensor], choice: str) -> Selection:
    """Check (and under "auto" time) the candidates on copies of `args` and pick one."""
    device = args[0].device
    signature = {
        "op": op,
        "shapes": tuple(tuple(t.shape) for t in args),
        "dtype": str(args[0].dtype).removeprefix("torch."),
        "device": str(device),
    }
    if choice == "torch":
        return Selection(**signature, name="torch")
    names = AUTO_ORDER if choice == "auto" else (choice,)
    missing = {n: why for n in names if (why := unavailable(n, device))}
    failed: dict[str, str] = {}
    if choice != "auto":  # asked for by name: not having it is a failure, with its warning
        for name, why in missing.items():
            _warn_once(name, why)
        failed, missing = missing, {}
    reference = _clones(args)
    expected = _results(op, CANDIDATES["torch"](op)(*reference), reference)
    ms: dict[str, float] = {}
    for name in (n for n in names if n not in missing and n not in failed):
        try:
            ms[name] = _trial(op, name, args, expected, timed=choice == "auto")
        except Exception as exc:  # any failure of an optional candidate: drop it, warn once
            failed[name] = f"{type(exc).__name__}: {exc}".strip()[:500]
            _warn_once(name, failed[name])
    if choice != "auto":
        return Selection(**signature, name=choice if choice in ms else "torch", failed=failed)
    # Timed last: the carry overwrites `reference`, whose tensors `expected` holds.
    ms["torch"] = _median_ms(CANDIDATES["torch"](op), reference)
    name = min(ms, key=ms.get)
    _forget_graphs(op, args, keep=name)
    return Selection(**signature, name=name, ms=ms, failed=failed, unavailable=missing)


def _forget_graphs(op: str, args: Sequence[Tensor], keep: str) -> None:
    """Free the trial graphs of the graph candidates not chosen (each holds copies of FZ)."""
    for name in GRAPHED:
        if name != keep and (name, op) in _graphed:
            _graphed[name, op].forget(args)


def _trial(op: str, name: str, args, expected: list[Tensor], timed: bool) -> float:
    """Run candidate `name` on copies of args, raise unless it agrees with the torch path;
    return its median time in ms (0.0 when not timed)."""
    fn = CANDIDATES[name](op)
    trial = _clones(args)
    got = _results(op, fn(*trial), trial)
    err = max_relative_error(got, expected)
    tolerance = TOLERANCE.get(args[0].dtype, 1e-4)
    if not err <= tolerance:  # also catches NaN
        raise ArithmeticError(f"differs from the torch path by {err:.2e} (> {tolerance:.0e})")
    return _median_ms(fn, trial) if timed else 0.0


def _results(op: str, out: tuple[Tensor, Tensor], args) -> list[Tensor]:
    """What a candidate produces: the two gradients, and for "carry" the overwritten stored, wb."""
    return [*out, args[0], args[1]] if op == "carry" else list(out)


def max_relative_error(got: Sequence[Tensor], expected: Sequence[Tensor]) -> float:
    """max over tensors of ||got - expected|| / ||expected|| (the difference's norm where
    expected is zero)."""
    errors = []
    for g, e in zip(got, expected, strict=True):
        diff, norm = float((g - e).norm()), float(e.norm())
        errors.append(diff / norm if norm > 0 else diff)
    return max(errors)


def _clones(args: Sequence[Tensor]) -> list[Tensor]:
    return [t.clone() for t in args]  # same strides for the dense tensors the layer passes


def _median_ms(fn: Callable, args) -> float:
    """Median ms of TRIAL_REPEATS calls after one warm-up (fn may overwrite args: the carry)."""
    return time_alternating({"fn": lambda: fn(*args)}, TRIAL_REPEATS, 1, args[0].device)["fn"]


def _warn_once(name: str, why: str) -> None:
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"r2ac: GPU carry candidate {name!r} dropped ({why}); using the PyTorch path"
            f" (same results). Set {ENV}=torch to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )


# -- the dispatch the layer calls --------------------------------------------------------------


def _fused(sens: ELSTMSensitivity) -> bool:
    """CUDA, a float dtype the check knows, and FZ in the layer's storage layout."""
    return sens.FZ.is_cuda and sens.FZ.dtype in TOLERANCE and em.in_place_ready(sens)


def history(d_hat: Tensor, sens: ELSTMSensitivity) -> tuple[Tensor, Tensor]:
    """`elstm_math.inject_gradients`, by the selected candidate on CUDA."""
    if not _fused(sens):
        return em.inject_gradients(d_hat, sens)
    return run("history", sens.FZ.permute(0, 3, 1, 2), sens.wb, d_hat)


def history_and_carry_in_place(
    d_hat: Tensor, sens: ELSTMSensitivity, trace: RecurrenceTrace, x: Tensor
) -> tuple[Tensor, Tensor]:
    """`elstm_math.history_and_carry_in_place`, by the selected candidate on CUDA."""
    if not _fused(sens):
        return em.history_and_carry_in_place(d_hat, sens, trace, x)
    return run("carry", sens.FZ.permute(0, 3, 1, 2), sens.wb, *trace, x, d_hat)
