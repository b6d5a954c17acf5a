"""LRU: exact RTRL and truncated BPTT against a complex-arithmetic reference, checks."""

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl import LRU, LRUState, make_core
from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.gradcheck import (
    check_gradients,
    compare,
    layer_gradients,
    make_problem,
    reference_gradients,
)
from r2ac.rtrl.reference import lru_reference

from .common import F64, PATTERNS

PARAMS = {"nu_log", "theta_log", "gamma_log", "B_re", "B_im", "C_re", "C_im", "D"}


def make_layer(rule, D=5, H=4, N=3, seed=0, **kw):
    torch.manual_seed(seed)
    return LRU(D, H, rule, state_size=N, dtype=F64, **kw)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("N", [3, 4])
def test_rtrl_equals_full_bptt_through_history(pattern, batch, N):
    result = check_gradients(
        make_layer("rtrl", N=N), lru_reference, pattern, batch, reset_prob=0.15, seed=1
    )
    assert set(result.rel_error) == PARAMS
    assert result.max_rel_error < 1e-10, str(result)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_bptt_equals_truncated_bptt(pattern):
    result = check_gradients(make_layer("bptt"), lru_reference, pattern, 3, truncated=True, seed=2)
    assert result.max_rel_error < 1e-10, str(result)


def test_long_history_with_slow_decay():
    layer = make_layer("rtrl", r_min=0.99, r_max=0.999)
    result = check_gradients(layer, lru_reference, (5,) * 12, 2, reset_prob=0.02, seed=3)
    assert result.max_rel_error < 1e-10, str(result)


def test_the_check_can_fail():
    err = check_gradients(make_layer("bptt"), lru_reference, PATTERNS[0], 3, reset_prob=0.0, seed=3)
    recurrent = ("nu_log", "theta_log", "gamma_log", "B_re", "B_im")
    assert min(err.rel_error[k] for k in recurrent) > 1e-2, str(err)


def test_forward_matches_reference_and_splitting_changes_nothing():
    layer = make_layer("rtrl")
    problem = make_problem(5, 4, (6, 1, 5), 3, reset_prob=0.2, seed=5)
    with torch.no_grad():
        y_ref, h_ref = lru_reference(dict(layer.named_parameters()), problem.x, problem.reset)
        state, outs = layer.initial_state(3), []
        for sl in (slice(0, 6), slice(6, 7), slice(7, 12)):
            y, state = layer(problem.x[sl], state, reset=problem.reset[sl])
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs), y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(
        state.h, torch.stack([h_ref.real, h_ref.imag], 1), rtol=1e-13, atol=1e-13
    )


def test_float32_against_float64_reference():
    torch.manual_seed(0)
    layer = make_core("lru-rtrl", 5, 4, dtype=torch.float32, r_min=0.99, r_max=0.999)
    problem = make_problem(5, 4, (5,) * 8, 3, reset_prob=0.05, seed=7, dtype=torch.float32)
    grads = layer_gradients(layer, problem)
    p64 = {k: v.detach().double() for k, v in layer.named_parameters()}
    prob64 = type(problem)(
        problem.x.double(), problem.reset, problem.readout.double(), problem.segment_lengths
    )
    err = compare(
        {k: v.double() for k, v in grads.items()},
        reference_gradients(lru_reference, p64, prob64, False),
    )
    assert err.max_rel_error < 1e-4, str(err)


def test_state_shapes_and_errors():
    layer = make_layer("rtrl")
    s = layer.initial_state(2)
    assert (
        s.h.shape == (2, 2, 3)
        and s.sens.W.shape == (2, 1, 2, 3, 5)
        and s.sens.v.shape == (2, 3, 2, 3)
    )
    assert make_layer("bptt").initial_state(2).sens is None
    assert LRU(5, 6).state_size == 6  # state_size defaults to hidden_size
    x = torch.zeros(3, 2, 5, dtype=F64)
    with pytest.raises(ValueError, match=r"state.sens.v has shape \(2, 2, 2, 3\)"):
        layer(x, LRUState(s.h, pm.PairSensitivity(s.sens.W, torch.zeros(2, 2, 2, 3, dtype=F64))))
    with pytest.raises(ValueError, match="silently truncated"):
        layer(x, layer.initial_state(2, with_sensitivities=False))
    with pytest.raises(TypeError, match="LRUState"):
        layer(x, (s.h,))
    with pytest.raises(ConfigError, match="unknown rule 'snap1'"):
        LRU(5, 4, "snap1")
    with pytest.raises(ConfigError, match="r_min <= r_max < 1"):
        LRU(5, 4, r_min=0.0)


def test_skip_carry_and_advance_state():
    layer = make_layer("rtrl")
    x = torch.randn(4, 2, 5, dtype=F64)
    y, full = layer(x, layer.initial_state(2))
    y_skip, light = layer(x, layer.initial_state(2), carry=False)
    assert light.sens is None
    torch.testing.assert_close(y_skip, y, rtol=0, atol=0)
    advanced = layer.advance_state(x, layer.initial_state(2))
    for a, b in zip(advanced.sens, full.sens):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_initial_normalisation():
    """gamma starts at sqrt(1 - |Lambda|^2), so a unit-variance input gives a unit-variance state."""
    layer = LRU(5, 4, state_size=500, dtype=F64)
    r = torch.exp(-torch.exp(layer.nu_log.detach()))
    torch.testing.assert_close(
        torch.exp(2 * layer.gamma_log.detach()), 1 - r**2, rtol=1e-12, atol=0
    )
