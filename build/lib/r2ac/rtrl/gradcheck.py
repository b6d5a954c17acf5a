"""Gradient-check harness: any core and rule against full (or truncated) BPTT of a reference.

The layer under test runs segment by segment from `initial_state`, calling `loss.backward()`
once per segment and letting `.grad` accumulate, exactly as a learner with learning rate 0
would. The reference runs on the concatenated history in one piece (full BPTT) or, for
truncated rules, segment by segment with its state detached at every segment start. Resets
fall anywhere, including inside segments and on their first step.

    result = check_gradients(layer, elstm_reference, segment_lengths=[3, 1, 5], batch_size=4)
    assert result.max_rel_error < 1e-10
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

Reference = Callable[..., tuple[Tensor, object]]


@dataclass(frozen=True)
class Problem:
    """A fixed random problem: inputs, resets and a linear readout that defines the loss."""

    x: Tensor  # (T, B, D)
    reset: Tensor  # (T, B) bool
    readout: Tensor  # (T, B, N): loss = sum(y * readout)
    segment_lengths: tuple[int, ...]


@dataclass(frozen=True)
class GradCheckResult:
    rel_error: dict[str, float]  # ||g - g_ref|| / ||g_ref|| per parameter
    ref_norm: dict[str, float]

    @property
    def max_rel_error(self) -> float:
        return max(self.rel_error.values())

    def __str__(self) -> str:
        rows = [
            f"{k:>6}: rel err {v:.2e} (|g_ref| {self.ref_norm[k]:.2e})"
            for k, v in self.rel_error.items()
        ]
        return "\n".join(rows)


def make_problem(
    input_size: int,
    hidden_size: int,
    segment_lengths: Sequence[int],
    batch_size: int,
    reset_prob: float = 0.15,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    T, B = sum(segment_lengths), batch_size
    x = torch.randn(T, B, input_size, generator=gen, dtype=dtype)
    reset = torch.rand(T, B, generator=gen) < reset_prob
    readout = torch.randn(T, B, hidden_size, generator=gen, dtype=dtype)
    return Problem(x.to(device), reset.to(device), readout.to(device), tuple(segment_lengths))


def _segments(problem: Problem):
    t0 = 0
    for length in problem.segment_lengths:
        sl = slice(t0, t0 + length)
        yield problem.x[sl], problem.reset[sl], problem.readout[sl]
        t0 += length


def layer_gradients(layer: nn.Module, problem: Problem) -> dict[str, Tensor]:
    """Run `layer` segment by segment, one backward per segment; return the accumulated grads."""
    layer.zero_grad(set_to_none=True)
    state = layer.initial_state(problem.x.shape[1])
    for x, reset, readout in _segments(problem):
        y, state = layer(x, state, reset=reset)
        (y * readout).sum().backward()
    return {name: p.grad.detach().clone() for name, p in layer.named_parameters()}


def reference_gradients(
    reference: Reference, params: dict[str, Tensor], problem: Problem, truncated: bool
) -> dict[str, Tensor]:
    """Gradient of the total loss by autograd through `reference`.

    truncated=False: one call over the whole history (full BPTT).
    truncated=True: one call per segment, the state detached at each segment start.
    """
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    if not truncated:
        y, _ = reference(leaves, problem.x, problem.reset)
        loss = (y * problem.readout).sum()
    else:
        loss, state = 0.0, None
        for x, reset, readout in _segments(problem):
            y, state = reference(leaves, x, reset, state)
            state = pytree.tree_map(lambda t: t.detach(), state)
            loss = loss + (y * readout).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return dict(zip(leaves.keys(), grads))


def compare(grads: dict[str, Tensor], ref: dict[str, Tensor]) -> GradCheckResult:
    missing = set(ref) ^ set(grads)
    if missing:
        raise KeyError(f"parameter names differ between layer and reference: {sorted(missing)}")
    rel, norms = {}, {}
    for name, g_ref in ref.items():
        norm = g_ref.norm().item()
        rel[name] = (grads[name] - g_ref).norm().item() / max(norm, 1e-300)
        norms[name] = norm
    return GradCheckResult(rel, norms)


def check_gradients(
    layer: nn.Module,
    reference: Reference,
    segment_lengths: Sequence[int],
    batch_size: int,
    truncated: bool = False,
    reset_prob: float = 0.15,
    seed: int = 0,
) -> GradCheckResult:
    """Compare the layer's segment-by-segment gradients with the reference's (see module doc)."""
    p0 = next(layer.parameters())
    problem = make_problem(
        layer.input_size,
        layer.hidden_size,
        segment_lengths,
        batch_size,
        reset_prob,
        seed,
        dtype=p0.dtype,
        device=p0.device,
    )
    params = dict(layer.named_parameters())
    return compare(
        layer_gradients(layer, problem), reference_gradients(reference, params, problem, truncated)
    )
