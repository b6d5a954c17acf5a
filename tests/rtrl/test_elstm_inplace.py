"""eLSTM in-place carry (r2ac.rtrl.elstm.deferred): same numbers as the eager carry, and safe.

The carry of a segment runs at the end of its backward, over the input state's buffers, when
nothing else reads them; otherwise it runs out of place when the new state is first read.
The bookkeeping lives on the state's buffers: nothing is left behind by dropped graphs.
"""

import pytest
import torch

from r2ac.rtrl import ELSTM, ELSTMSensitivity, ELSTMState
from r2ac.rtrl.elstm import math as em
from r2ac.rtrl.elstm.deferred import ConsumedStateError
from r2ac.rtrl.gradcheck import make_problem, reference_gradients
from r2ac.rtrl.reference import elstm_reference
from r2ac.rtrl.state import select_streams

from .common import F64, PATTERNS

D, N = 5, 4


def make_layer(inplace: bool, seed: int = 0) -> ELSTM:
    torch.manual_seed(seed)
    return ELSTM(D, N, "rtrl", dtype=F64, inplace_carry=inplace)


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def run_online(layer: ELSTM, problem, batch: int):
    """One backward per segment; returns the grads, the final state and every state's FZ storage."""
    layer.zero_grad(set_to_none=True)
    state = layer.initial_state(batch)
    storages, t0 = {storage(state.sens.FZ)}, 0
    for length in problem.segment_lengths:
        sl = slice(t0, t0 + length)
        y, state = layer(problem.x[sl], state, reset=problem.reset[sl])
        (y * problem.readout[sl]).sum().backward()
        storages.add(storage(state.sens.FZ))
        t0 += length
    grads = {k: p.grad.clone() for k, p in layer.named_parameters()}
    return grads, state, storages


@pytest.mark.parametrize("pattern", PATTERNS)
def test_in_place_carry_equals_eager_carry_and_reuses_one_buffer(pattern):
    problem = make_problem(D, N, pattern, batch_size=3, reset_prob=0.2, seed=1)
    g_in, s_in, storages_in = run_online(make_layer(True), problem, 3)
    g_eager, s_eager, storages_eager = run_online(make_layer(False), problem, 3)
    for k in g_in:
        torch.testing.assert_close(g_in[k], g_eager[k], rtol=1e-12, atol=1e-13)
    for a, b in zip((s_in.c, *s_in.sens), (s_eager.c, *s_eager.sens)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert len(storages_in) == 1  # every segment carried over the same buffer
    assert len(storages_eager) > 1  # new buffers (freed ones may be reused by the allocator)


def test_carry_segment_in_place_equals_carry_segment():
    torch.manual_seed(3)
    B = 3
    for T in (1, 6):
        trace = em.RecurrenceTrace(*(torch.rand(T, B, N, dtype=F64) for _ in range(4)))
        trace.a[0, 1] = 0.0  # a reset
        x = torch.randn(T, B, D, dtype=F64)
        sens = ELSTMSensitivity(
            em.zero_FZ(B, N, D, dtype=F64).normal_(), torch.randn(B, 4, N, dtype=F64)
        )
        want = em.carry_segment(sens, trace, x)
        if T == 1:
            step = em.carry_step(sens, trace, x)
            torch.testing.assert_close(want.FZ, step.FZ, rtol=1e-13, atol=1e-13)
        assert em.in_place_ready(sens)
        em.carry_segment_in_place(sens, trace, x)
        torch.testing.assert_close(sens.FZ, want.FZ, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(sens.wb, want.wb, rtol=1e-13, atol=1e-13)
    plain = ELSTMSensitivity(torch.randn(B, 2, N, D, dtype=F64), torch.randn(B, 4, N, dtype=F64))
    assert not em.in_place_ready(plain)  # a user's plain layout takes the eager carry


def test_next_forward_before_backward_runs_the_carry_out_of_place():
    """Two segments forward, then one backward of their summed loss: still the full gradient."""
    problem = make_problem(D, N, (4, 3), batch_size=2, reset_prob=0.2, seed=2)
    layer = make_layer(True)
    state0 = layer.initial_state(2)
    y1, s1 = layer(problem.x[:4], state0, reset=problem.reset[:4])
    y2, s2 = layer(problem.x[4:], s1, reset=problem.reset[4:])  # s1 read before any backward
    s1_FZ = s1.sens.FZ
    assert storage(s1_FZ) != storage(state0.sens.FZ)
    ((y1 * problem.readout[:4]).sum() + (y2 * problem.readout[4:]).sum()).backward()
    params = dict(layer.named_parameters())
    want = reference_gradients(elstm_reference, params, problem, truncated=False)
    for k, p in params.items():
        torch.testing.assert_close(p.grad, want[k], rtol=1e-10, atol=1e-12)
    assert storage(s2.sens.FZ) == storage(s1_FZ) and s1.sens.consumed  # 2nd carry in place
    layer(problem.x[:1], state0)  # s1's carry ran out of place: state0 was left intact


def test_two_graphs_on_one_state_leave_it_intact():
    problem = make_problem(D, N, (5,), batch_size=2, seed=3)
    results = []
    for inplace in (True, False):
        layer = make_layer(inplace)
        state = layer.initial_state(2)
        with torch.no_grad():
            _, state = layer(problem.x, state)  # non-zero sensitivities
        before = [t.clone() for t in state.sens]
        y_a, s_a = layer(problem.x, state)
        y_b, s_b = layer(problem.x.flip(0), state)
        (y_a * problem.readout).sum().backward()  # graph b still reads state: no in-place
        (y_b * problem.readout).sum().backward()
        assert all(torch.equal(a, b) for a, b in zip(state.sens, before))
        results.append(([p.grad.clone() for p in layer.parameters()], [*s_a.sens, *s_b.sens]))
    for got, want in zip(*(g + s for g, s in results)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


def test_consumed_state_is_refused_and_helpers_see_the_carried_state():
    problem = make_problem(D, N, (3,), batch_size=2, seed=4)
    eager = make_layer(False)
    y, s_eager = eager(problem.x, eager.initial_state(2))
    layer = make_layer(True)
    state0 = layer.initial_state(2)
    y, s1 = layer(problem.x, state0)
    picked = select_streams(s1, slice(1, 2))  # reads s1 before the backward: carry runs first
    torch.testing.assert_close(picked.sens.FZ, s_eager.sens.FZ[1:2], rtol=1e-13, atol=1e-13)
    (y * problem.readout).sum().backward()
    s1_FZ = s1.sens.FZ
    y, s2 = layer(problem.x, s1)
    (y * problem.readout).sum().backward()  # nothing else reads s1 now: in place
    assert storage(s2.sens.FZ) == storage(s1_FZ)
    with pytest.raises(ConsumedStateError, match="overwritten in place"):
        layer(problem.x, s1)
    with pytest.raises(ConsumedStateError):
        layer.advance_state(problem.x, s1)
    with pytest.raises(ConsumedStateError):
        select_streams(s1, 0)


def test_backward_twice_after_an_in_place_carry_raises():
    problem = make_problem(D, N, (3,), batch_size=2, seed=5)
    layer = make_layer(True)
    y, _ = layer(problem.x, layer.initial_state(2))
    loss = (y * problem.readout).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_user_state_in_plain_layout_is_never_written():
    """A state built by hand as plain (B, 2, N, D) tensors takes the eager carry."""
    layer = make_layer(True)
    problem = make_problem(D, N, (3,), batch_size=2, seed=6)
    state = ELSTMState(
        torch.randn(2, N, dtype=F64),
        ELSTMSensitivity(torch.randn(2, 2, N, D, dtype=F64), torch.randn(2, 4, N, dtype=F64)),
    )
    before = [t.clone() for t in state.sens]
    y, new = layer(problem.x, state)
    (y * problem.readout).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(state.sens, before))
    layer(problem.x, state)  # still usable
