"""Fast weight programmer: exact RTRL with the rank-one gradient form, against BPTT."""

import pytest
import torch

from r2ac.rtrl import FWP, FWPSensitivity, FWPState
from r2ac.rtrl import fwp as fw
from r2ac.rtrl.gradcheck import (
    check_gradients,
    make_problem,
)
from r2ac.rtrl.reference import fwp_reference

from .common import F64, PATTERNS


def make_layer(rule, D=5, N=4, seed=0):
    torch.manual_seed(seed)
    return FWP(D, N, rule, dtype=F64)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("batch", [1, 3])
def test_rtrl_equals_full_bptt_through_history(pattern, batch):
    result = check_gradients(
        make_layer("rtrl"), fwp_reference, pattern, batch, reset_prob=0.15, seed=1
    )
    assert set(result.rel_error) == {"K", "V", "Q"}
    assert result.max_rel_error < 1e-10, str(result)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_bptt_equals_truncated_bptt(pattern):
    result = check_gradients(make_layer("bptt"), fwp_reference, pattern, 3, truncated=True, seed=2)
    assert result.max_rel_error < 1e-10, str(result)


def test_the_check_can_fail():
    err = check_gradients(make_layer("bptt"), fwp_reference, PATTERNS[0], 3, reset_prob=0.0, seed=3)
    assert err.rel_error["K"] > 1e-2 and err.rel_error["V"] > 1e-2, str(err)
    assert err.rel_error["Q"] < 1e-10  # Q only reads the fast weights: BPTT is already exact


def test_rank_one_history_gradient_equals_dense_contraction():
    """sum_t s (e^T Kh) and e (s^T Vh) == d_hat^T Kh and d_hat Vh with d_hat = sum_t m outer(e, s)."""
    torch.manual_seed(4)
    T, B, N, D = 5, 3, 4, 6
    e, s = torch.randn(T, B, N, dtype=F64), torch.rand(T, B, N, dtype=F64)
    m = (torch.rand(T, B) > 0.3).to(F64)
    sens = FWPSensitivity(torch.randn(B, N, D, dtype=F64), torch.randn(B, N, D, dtype=F64))
    dK, dV = fw.history_gradients(e, s, m, sens)
    d_hat = torch.einsum("tb,tbi,tbj->bij", m, e, s)  # (B, N, N) = dL / dW(t0)
    torch.testing.assert_close(
        dK, torch.einsum("bij,bid->jd", d_hat, sens.Kh), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(
        dV, torch.einsum("bij,bjd->id", d_hat, sens.Vh), rtol=1e-12, atol=1e-12
    )


def test_forward_and_fast_weights_match_reference_across_splits():
    layer = make_layer("rtrl")
    problem = make_problem(5, 4, (6, 1, 5), 3, reset_prob=0.2, seed=5)
    with torch.no_grad():
        y_ref, W_ref = fwp_reference(dict(layer.named_parameters()), problem.x, problem.reset)
        state, outs = layer.initial_state(3), []
        for sl in (slice(0, 6), slice(6, 7), slice(7, 12)):
            y, state = layer(problem.x[sl], state, reset=problem.reset[sl])
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs), y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state.W, W_ref, rtol=1e-13, atol=1e-13)
    # Kh = sum outer(v, x) since the last reset of each stream
    last = [max([0] + [t for t in range(12) if problem.reset[t, b]]) for b in range(3)]
    x, V = problem.x, layer.V.detach()
    Kh = torch.stack(
        [
            sum((V @ x[t, b])[:, None] * x[t, b][None, :] for t in range(last[b], 12))
            for b in range(3)
        ]
    )
    torch.testing.assert_close(state.sens.Kh, Kh, rtol=1e-12, atol=1e-12)


def test_state_shapes_and_errors():
    layer = make_layer("rtrl")
    s = layer.initial_state(2)
    assert s.W.shape == (2, 4, 4) and s.sens.Kh.shape == (2, 4, 5) and s.sens.Vh.shape == (2, 4, 5)
    assert make_layer("bptt").initial_state(2).sens is None
    x = torch.zeros(3, 2, 5, dtype=F64)
    with pytest.raises(ValueError, match="state.W has shape"):
        layer(x, FWPState(torch.zeros(2, 4, 5, dtype=F64), s.sens))
    with pytest.raises(ValueError, match="silently truncated"):
        layer(x, layer.initial_state(2, with_sensitivities=False))
    with pytest.raises(TypeError, match="FWPState"):
        layer(x, (s.W,))
