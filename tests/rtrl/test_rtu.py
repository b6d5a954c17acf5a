"""RTU: exact RTRL and truncated BPTT against the step-by-step reference, carry forms, checks."""

import functools

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl import RTU, RTUState, make_core
from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.gradcheck import (
    check_gradients,
    compare,
    layer_gradients,
    make_problem,
    reference_gradients,
)
from r2ac.rtrl.reference import rtu_reference
from r2ac.rtrl.rtu import immediate_vector_derivatives, rtu_carry, rtu_coefficients

from .common import ACT_CALLS, ACT_RESETS, F64, PATTERNS, act_segment, max_rel_error

VARIANTS = [(False, "tanh"), (False, "relu"), (True, "tanh"), (True, "relu")]


def make_layer(rule, nonlinear=False, activation="tanh", D=5, H=8, seed=0, **kw):
    torch.manual_seed(seed)
    return RTU(D, H, rule, nonlinear=nonlinear, activation=activation, dtype=F64, **kw)


def reference(nonlinear, activation):
    return functools.partial(rtu_reference, nonlinear=nonlinear, activation=activation)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("nonlinear, activation", VARIANTS)
@pytest.mark.parametrize("batch", [1, 3])
def test_rtrl_equals_full_bptt_through_history(pattern, nonlinear, activation, batch):
    layer = make_layer("rtrl", nonlinear, activation)
    result = check_gradients(
        layer, reference(nonlinear, activation), pattern, batch, reset_prob=0.15, seed=1
    )
    assert set(result.rel_error) == {"nu_log", "theta_log", "W1", "W2"}
    assert result.max_rel_error < 1e-10, str(result)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("nonlinear, activation", VARIANTS)
def test_bptt_equals_truncated_bptt(pattern, nonlinear, activation):
    layer = make_layer("bptt", nonlinear, activation)
    result = check_gradients(
        layer, reference(nonlinear, activation), pattern, 3, truncated=True, seed=2
    )
    assert result.max_rel_error < 1e-10, str(result)


def test_long_history_with_slow_decay():
    """60 steps in segments of 5, r close to 1 (long memory): the carried term dominates."""
    layer = make_layer("rtrl", r_min=0.99, r_max=0.999)
    result = check_gradients(layer, reference(False, "tanh"), (5,) * 12, 2, reset_prob=0.02, seed=3)
    assert result.max_rel_error < 1e-10, str(result)


def test_the_check_can_fail():
    """Truncated BPTT is far from the full gradient: the harness sees the difference."""
    err = check_gradients(
        make_layer("bptt"), reference(False, "tanh"), PATTERNS[0], 3, reset_prob=0.0, seed=3
    )
    assert min(err.rel_error.values()) > 1e-2, str(err)


@pytest.mark.parametrize("with_reset", [False, True])
def test_linear_complex_carry_equals_the_general_2x2_carry(with_reset):
    """The linear RTU's carry (complex powers, one stored map) against the general per-unit
    2 x 2 loop with both maps carried: S_W1 equal, S_W2 = i S_W1, S_v equal."""
    torch.manual_seed(4)
    T, B, N, D = 7, 3, 4, 5
    layer = make_layer("rtrl", D=D, H=2 * N)
    S1 = torch.randn(B, 1, 2, N, D, dtype=F64)
    S_v = torch.randn(B, 2, 2, N, dtype=F64)
    x, cp, u = (
        torch.randn(T, B, D, dtype=F64),
        torch.randn(T, B, 2, N, dtype=F64),
        torch.randn(T, B, 2, N, dtype=F64),
    )
    keep = None
    if with_reset:
        keep = torch.ones(T, B, 1, dtype=F64)
        keep[2, 1] = keep[6, 2] = keep[0, 0] = 0.0
    params = (layer.nu_log.detach(), layer.theta_log.detach())
    lin = rtu_carry(pm.PairSensitivity(S1, S_v), x, cp, u, cp, keep, params, False, "tanh")
    g, phi, gamma, nu, theta = rtu_coefficients(*params)
    ones = torch.ones(T, B, 2, N, dtype=F64)
    P, G = pm.block_products(pm.step_jacobians(g, phi, ones, keep))
    E_v = immediate_vector_derivatives(cp, u, ones, g, phi, gamma, nu, theta)
    S_both = torch.cat([S1, pm.times_i(S1, 2)], 1)  # (B, 2, 2, N, D)
    gen = pm.carry_segment(
        pm.PairSensitivity(S_both, S_v), P, G, pm.input_directions(P, gamma, ones), x, E_v
    )
    torch.testing.assert_close(lin.W[:, 0], gen.W[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pm.times_i(lin.W[:, 0], 1), gen.W[:, 1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lin.v, gen.v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("nonlinear", [False, True])
def test_segment_carry_equals_one_step_carries(nonlinear):
    """The state after one T-step segment equals T one-step segments (carry regrouped exactly)."""
    layer = make_layer("rtrl", nonlinear)
    problem = make_problem(5, 8, (9,), 3, reset_prob=0.2, seed=5)
    with torch.no_grad():
        _, whole = layer(problem.x, layer.initial_state(3), reset=problem.reset)
        state = layer.initial_state(3)
        for t in range(9):
            _, state = layer(problem.x[t : t + 1], state, reset=problem.reset[t : t + 1])
    for a, b in zip(whole.sens, state.sens):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert float(whole.sens.W.abs().max()) > 1e-2  # not trivially zero


def test_forward_matches_reference_and_splitting_changes_nothing():
    layer = make_layer("rtrl")
    problem = make_problem(5, 8, (6, 1, 5), 3, reset_prob=0.2, seed=6)
    with torch.no_grad():
        y_ref, (c1, c2) = rtu_reference(dict(layer.named_parameters()), problem.x, problem.reset)
        state, outs = layer.initial_state(3), []
        for sl in (slice(0, 6), slice(6, 7), slice(7, 12)):
            y, state = layer(problem.x[sl], state, reset=problem.reset[sl])
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs), y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state.c, torch.stack([c1, c2], 1), rtol=1e-13, atol=1e-13)
    assert y_ref.shape == (12, 3, 8)  # h = act([c1; c2]): hidden_size = 2 x units


def test_float32_against_float64_reference():
    """float32 over 40 steps in 8 segments with resets, slow decay: < 1e-4 relative to float64."""
    torch.manual_seed(0)
    layer = make_core("rtu-rtrl", 5, 8, dtype=torch.float32, r_min=0.99, r_max=0.999)
    problem = make_problem(5, 8, (5,) * 8, 3, reset_prob=0.05, seed=7, dtype=torch.float32)
    grads = layer_gradients(layer, problem)
    p64 = {k: v.detach().double() for k, v in layer.named_parameters()}
    prob64 = type(problem)(
        problem.x.double(), problem.reset, problem.readout.double(), problem.segment_lengths
    )
    err = compare(
        {k: v.double() for k, v in grads.items()},
        reference_gradients(rtu_reference, p64, prob64, False),
    )
    assert err.max_rel_error < 1e-4, str(err)


def test_state_shapes_and_errors():
    layer = make_layer("rtrl")
    s = layer.initial_state(2)
    assert (
        s.c.shape == (2, 2, 4)
        and s.sens.W.shape == (2, 1, 2, 4, 5)  # linear: S_W2 = i S_W1 is not stored
        and s.sens.v.shape == (2, 2, 2, 4)
    )
    assert make_layer("rtrl", nonlinear=True).initial_state(2).sens.W.shape == (2, 2, 2, 4, 5)
    assert make_layer("bptt").initial_state(2).sens is None
    x = torch.zeros(3, 2, 5, dtype=F64)
    with pytest.raises(ValueError, match=r"state.sens.W has shape \(2, 1, 2, 4, 4\)"):
        layer(x, RTUState(s.c, pm.PairSensitivity(torch.zeros(2, 1, 2, 4, 4, dtype=F64), s.sens.v)))
    with pytest.raises(ValueError, match=r"state.c has shape \(2, 4\)"):
        layer(x, RTUState(torch.zeros(2, 4, dtype=F64), s.sens))
    with pytest.raises(ValueError, match="silently truncated"):
        layer(x, layer.initial_state(2, with_sensitivities=False))
    with pytest.raises(TypeError, match="RTUState"):
        layer(x, (s.c,))
    with pytest.raises(ConfigError, match="must be even, got 7"):
        RTU(5, 7)
    with pytest.raises(ConfigError, match="unknown activation 'gelu'"):
        RTU(5, 8, activation="gelu")
    with pytest.raises(ConfigError, match="unknown rule 'snap1'"):
        RTU(5, 8, "snap1")
    with pytest.raises(ConfigError, match="r_min <= r_max < 1"):
        RTU(5, 8, r_max=1.0)


def test_skip_carry_and_advance_state():
    layer = make_layer("rtrl", nonlinear=True)
    x = torch.randn(4, 2, 5, dtype=F64)
    y, full = layer(x, layer.initial_state(2))
    y_skip, light = layer(x, layer.initial_state(2), carry=False)
    assert light.sens is None
    torch.testing.assert_close(y_skip, y, rtol=0, atol=0)
    advanced = layer.advance_state(x, layer.initial_state(2))
    for a, b in zip(advanced.sens, full.sens):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not advanced.c.requires_grad


@pytest.mark.parametrize("nonlinear, activation", VARIANTS)
def test_act_and_carry_traces_equal_advance_state(nonlinear, activation):
    """The actor's path for every RTU variant (the registry holds the linear tanh one only):
    act call by call with resets, then carry_traces == advance_state over two segments."""
    layer = make_layer("rtrl", nonlinear, activation)
    got = want = layer.advance_state(torch.randn(3, 3, 5, dtype=F64), layer.initial_state(3))
    reset = torch.zeros(sum(ACT_CALLS), 3, dtype=torch.bool)
    for t, b in ACT_RESETS:
        reset[t, b] = True
    for _ in range(2):
        x = torch.randn(sum(ACT_CALLS), 3, 5, dtype=F64)
        y, _, traces = act_segment(layer, got, x, reset)
        with torch.no_grad():
            torch.testing.assert_close(y, layer(x, got, reset=reset)[0], rtol=1e-13, atol=1e-13)
        got, want = layer.carry_traces(got, traces), layer.advance_state(x, want, reset=reset)
        for a, b in zip((got.c, *got.sens), (want.c, *want.sens)):
            assert max_rel_error(a, b) < 1e-12


def test_initial_ring():
    layer = RTU(5, 2000, r_min=0.9, r_max=0.999, dtype=F64)
    r = torch.exp(-torch.exp(layer.nu_log.detach()))
    theta = torch.exp(layer.theta_log.detach())
    assert 0.9 <= float(r.min()) and float(r.max()) <= 0.999
    assert 0.0 < float(theta.min()) and float(theta.max()) <= 2 * torch.pi + 1e-12
    assert abs(float((r**2).mean()) - (0.9**2 + 0.999**2) / 2) < 0.01  # uniform in area
