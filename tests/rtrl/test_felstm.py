"""feLSTM (BPTT, segment-wise SnAp-1) and eLSTM SnAp-1: exact where the recurrence is diagonal."""

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl import ELSTM, FeLSTM, FeLSTMState
from r2ac.rtrl.gradcheck import (
    check_gradients,
    compare,
    layer_gradients,
    make_problem,
    reference_gradients,
)
from r2ac.rtrl.reference import elstm_reference, felstm_reference

from .common import F64, PATTERNS

RECURRENT = ("F", "Z", "W_f", "W_z", "b_f", "b_z")


def make_layer(rule, D=5, N=4, seed=0, diagonal=False):
    torch.manual_seed(seed)
    layer = FeLSTM(D, N, rule, dtype=F64)
    if diagonal:
        with torch.no_grad():
            layer.W_f.copy_(torch.diag(layer.W_f.diagonal()))
            layer.W_z.copy_(torch.diag(layer.W_z.diagonal()))
    return layer


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("batch", [1, 3])
def test_snap1_with_diagonal_recurrence_equals_full_bptt(pattern, batch):
    result = check_gradients(
        make_layer("snap1", diagonal=True), felstm_reference, pattern, batch, seed=1
    )
    assert result.max_rel_error < 1e-10, str(result)
    assert result.ref_norm["W_f"] > 0  # the off-diagonal entries have gradients too, exactly


@pytest.mark.parametrize("pattern", PATTERNS)
def test_elstm_snap1_equals_full_bptt(pattern):
    torch.manual_seed(0)
    result = check_gradients(ELSTM(5, 4, "snap1", dtype=F64), elstm_reference, pattern, 3, seed=1)
    assert result.max_rel_error < 1e-10, str(result)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_bptt_equals_truncated_bptt(pattern):
    result = check_gradients(
        make_layer("bptt"), felstm_reference, pattern, 3, truncated=True, seed=2
    )
    assert result.max_rel_error < 1e-10, str(result)


def _cosine(a: dict, b: dict) -> float:
    va = torch.cat([a[k].flatten() for k in RECURRENT])
    vb = torch.cat([b[k].flatten() for k in RECURRENT])
    return float(va @ vb / (va.norm() * vb.norm()))


def test_dense_snap1_is_an_approximation_better_than_truncation():
    """Fixed problem (N=16, D=8, B=4, 60 steps in segments of 5): the numbers of docs/rules/snap1.md."""
    snap = make_layer("snap1", D=8, N=16)
    bptt = make_layer("bptt", D=8, N=16)
    problem = make_problem(8, 16, (5,) * 12, 4, reset_prob=0.0, seed=0)
    exact = reference_gradients(
        felstm_reference, dict(snap.named_parameters()), problem, truncated=False
    )
    g_snap, g_bptt = layer_gradients(snap, problem), layer_gradients(bptt, problem)
    cos_snap, cos_bptt = _cosine(g_snap, exact), _cosine(g_bptt, exact)
    assert 0.95 < cos_snap < 1 - 1e-6, cos_snap  # not exact ...
    assert cos_bptt < cos_snap - 0.05, (cos_bptt, cos_snap)  # ... but closer than truncation
    err = compare(g_snap, exact)
    assert max(err.rel_error[k] for k in ("O", "W_o", "b_o")) < 1e-10  # readout exact


def test_the_check_can_fail():
    layer = make_layer("bptt", diagonal=True)
    err = check_gradients(layer, felstm_reference, PATTERNS[0], 3, reset_prob=0.0, seed=3)
    assert min(err.rel_error[k] for k in RECURRENT) > 1e-2, str(err)


def test_forward_matches_reference():
    layer = make_layer("snap1")
    problem = make_problem(5, 4, (6, 1, 5), 3, reset_prob=0.2, seed=5)
    with torch.no_grad():
        y_ref, c_ref = felstm_reference(dict(layer.named_parameters()), problem.x, problem.reset)
        state, outs = layer.initial_state(3), []
        for sl in (slice(0, 6), slice(6, 7), slice(7, 12)):
            y, state = layer(problem.x[sl], state, reset=problem.reset[sl])
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs), y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state.c, c_ref, rtol=1e-13, atol=1e-13)


def test_state_shapes_and_errors():
    layer = make_layer("snap1")
    s = layer.initial_state(2)
    assert s.c.shape == (2, 4) and s.sens.M.shape == (2, 2, 4, 9) and s.sens.b.shape == (2, 2, 4)
    assert make_layer("bptt").initial_state(2).sens is None
    x = torch.zeros(3, 2, 5, dtype=F64)
    with pytest.raises(ValueError, match="silently truncated"):
        layer(x, layer.initial_state(2, with_sensitivities=False))
    with pytest.raises(TypeError, match="FeLSTMState"):
        layer(x, (s.c,))
    with pytest.raises(ValueError, match="state.c has shape"):
        layer(x, FeLSTMState(torch.zeros(3, 4, dtype=F64), s.sens))
    with pytest.raises(ConfigError, match="unknown rule 'rtrl'"):
        FeLSTM(5, 4, "rtrl")
