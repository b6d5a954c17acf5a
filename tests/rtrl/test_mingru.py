"""minGRU: exact RTRL and truncated BPTT against the step-by-step reference, the carry, checks.

The contract suite (test_contract.py) runs the registry's mingru-rtrl / mingru-bptt; here the
variants (plain candidate, no tanh), long histories, the carry's closed form and the init."""

import functools

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl import MinGRU, MinGRUState, make_core
from r2ac.rtrl.gradcheck import check_gradients
from r2ac.rtrl.mingru import (
    MinGRUSensitivity,
    candidate,
    candidate_and_derivative,
    local_derivatives,
    mingru_carry,
)
from r2ac.rtrl.reference import mingru_reference

from .common import F64, PATTERNS

VARIANTS = [("g", "tanh"), ("g", "identity"), ("linear", "tanh"), ("linear", "identity")]
PARAMS = {"W_z", "W_h", "b_z", "b_h"}


def make_layer(rule, cand="g", output="tanh", D=5, N=4, seed=0, b_z=0.0):
    """The layer with its biases drawn too (they start at zero), b_z shifted by `b_z`."""
    torch.manual_seed(seed)
    layer = MinGRU(D, N, rule, candidate=cand, output=output, dtype=F64)
    with torch.no_grad():
        layer.b_z.normal_().add_(b_z)
        layer.b_h.normal_()
    return layer


def reference(cand, output):
    return functools.partial(mingru_reference, candidate=cand, output=output)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("cand, output", VARIANTS)
@pytest.mark.parametrize("batch", [1, 3])
def test_rtrl_equals_full_bptt_through_history(pattern, cand, output, batch):
    result = check_gradients(
        make_layer("rtrl", cand, output), reference(cand, output), pattern, batch, seed=1
    )
    assert set(result.rel_error) == PARAMS
    assert result.max_rel_error < 1e-10, str(result)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("cand, output", VARIANTS)
def test_bptt_equals_truncated_bptt(pattern, cand, output):
    layer = make_layer("bptt", cand, output)
    result = check_gradients(layer, reference(cand, output), pattern, 3, truncated=True, seed=2)
    assert result.max_rel_error < 1e-10, str(result)


def test_long_history_with_slow_forgetting():
    """80 steps in segments of 5 with z ~ 0.05 (b_z ~ -3: the state kept ~20 steps): the
    carried term dominates, and is exact."""
    layer = make_layer("rtrl", b_z=-3.0)
    result = check_gradients(layer, reference("g", "tanh"), (5,) * 16, 2, reset_prob=0.02, seed=3)
    assert result.max_rel_error < 1e-10, str(result)
    truncated = check_gradients(
        make_layer("bptt", b_z=-3.0), reference("g", "tanh"), (5,) * 16, 2, reset_prob=0.02, seed=3
    )
    assert truncated.max_rel_error > 1e-2, str(truncated)  # the history matters here


def test_the_check_can_fail():
    """Truncated BPTT is far from the full gradient: the harness sees the difference."""
    err = check_gradients(
        make_layer("bptt"), reference("g", "tanh"), PATTERNS[0], 3, reset_prob=0.0, seed=3
    )
    assert min(err.rel_error.values()) > 1e-3, str(err)


@pytest.mark.parametrize("with_reset", [False, True])
def test_carry_equals_the_step_by_step_recursion(with_reset):
    """`mingru_carry` (suffix products, one GEMM) against S <- a S + e x^T step by step."""
    gen = torch.Generator().manual_seed(4)
    T, B, N, D = 7, 3, 4, 5
    x = torch.randn(T, B, D, dtype=F64, generator=gen)
    a = torch.rand(T, B, N, dtype=F64, generator=gen)
    if with_reset:
        a[2, 1] = 0.0  # a stream restarts at step 2 (keep = 0)
        a[6, 0] = 0.0  # and one at the last step
    e = torch.randn(T, B, 2, N, dtype=F64, generator=gen)
    start = MinGRUSensitivity(
        torch.randn(B, 2, N, D, dtype=F64, generator=gen),
        torch.randn(B, 2, N, dtype=F64, generator=gen),
    )
    W, b = start
    for t in range(T):
        W = a[t][:, None, :, None] * W + e[t].unsqueeze(-1) * x[t][:, None, None, :]
        b = a[t].unsqueeze(1) * b + e[t]
    got = mingru_carry(start, x, a, e)
    torch.testing.assert_close(got.W, W, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(got.b, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kind", ["g", "linear"])
def test_candidate_and_its_derivative_are_the_where_forms(kind):
    """g(a) = a + 1/2 for a >= 0, sigmoid(a) below: the same numbers as the `where` that
    defines it, and the derivative (returned, and in the backward) autograd's of that `where`
    (1 at a = 0), 0 included."""
    pre = torch.tensor([-3.0, -0.5, 0.0, 0.25, 2.0, -40.0, 40.0], dtype=F64)
    leaf = pre.clone().requires_grad_()
    want = leaf if kind == "linear" else torch.where(leaf >= 0, leaf + 0.5, torch.sigmoid(leaf))
    (want_d,) = torch.autograd.grad(want.sum(), leaf)
    got_leaf = pre.clone().requires_grad_()
    c, dc = candidate(got_leaf, kind)
    (got_d,) = torch.autograd.grad(c.sum(), got_leaf)
    assert torch.equal(c.detach(), want.detach()) and torch.equal(dc, want_d)
    assert torch.equal(got_d, want_d)
    c_ng, dc_ng = candidate_and_derivative(pre, kind)
    assert torch.equal(c_ng, want.detach()) and torch.equal(dc_ng, want_d)
    if kind == "g":  # continuous at 0, positive everywhere
        assert float(c_ng[2]) == 0.5 and float(dc_ng[2]) == 1.0 and bool((c_ng > 0).all())


def test_local_derivatives_are_the_steps_jacobians():
    """a = d h / d hp and e = d h / d (pre_z, pre_h) of one step, by autograd."""
    gen = torch.Generator().manual_seed(5)
    pre = torch.randn(2, 3, 4, dtype=F64, generator=gen).requires_grad_()
    hp = torch.randn(3, 4, dtype=F64, generator=gen).requires_grad_()
    z, c = torch.sigmoid(pre[0]), torch.where(pre[1] >= 0, pre[1] + 0.5, torch.sigmoid(pre[1]))
    h = (1 - z) * hp + z * c
    g_pre, g_hp = torch.autograd.grad(h.sum(), [pre, hp])  # diagonal: the sums are the entries
    with torch.no_grad():
        a, e = local_derivatives(z, *candidate_and_derivative(pre[1], "g"), hp, None)
    torch.testing.assert_close(a, g_hp, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(e, g_pre.transpose(0, 1), rtol=1e-15, atol=1e-15)


def test_state_sizes_and_the_light_state():
    layer = make_core("mingru-rtrl", 5, 4, dtype=F64)
    state = layer.initial_state(3)
    assert isinstance(state, MinGRUState)
    assert state.h.shape == (3, 4) and state.sens.W.shape == (3, 2, 4, 5)
    assert state.sens.b.shape == (3, 2, 4)
    numbers = sum(t[0].numel() for t in (state.h, *state.sens))
    assert numbers == 4 + 2 * 4 * (5 + 1)  # N + 2 N (D + 1): O(parameters)
    assert layer.light_state(state).sens is None
    assert make_core("mingru-bptt", 5, 4).initial_state(2).sens is None


def test_initialisation_is_the_anchors():
    """W_z, W_h: lecun-normal (variance 1/D, truncated at 2 standard deviations); zero biases."""
    torch.manual_seed(0)
    layer = MinGRU(400, 300, dtype=F64)
    for W in (layer.W_z, layer.W_h):
        std = float(W.detach().std())
        assert abs(std * 20.0 - 1.0) < 0.02, std  # 1 / sqrt(400) = 0.05
        bound = 2.0 * 0.05 / 0.87962566103423978
        assert float(W.detach().abs().max()) <= bound
    assert not layer.b_z.detach().any() and not layer.b_h.detach().any()
    assert not torch.equal(layer.W_z, layer.W_h)


def test_float32_over_a_long_history():
    """float32, 120 steps with slow forgetting: < 1e-4 relative to the float64 reference."""
    from r2ac.rtrl.gradcheck import compare, layer_gradients, make_problem, reference_gradients

    layer = make_layer("rtrl", b_z=-3.0).float()
    problem = make_problem(5, 4, (10,) * 12, 3, reset_prob=0.01, seed=6, dtype=torch.float32)
    grads = layer_gradients(layer, problem)
    p64 = {k: v.detach().double() for k, v in layer.named_parameters()}
    prob64 = type(problem)(
        problem.x.double(), problem.reset, problem.readout.double(), problem.segment_lengths
    )
    ref = reference_gradients(mingru_reference, p64, prob64, truncated=False)
    err = compare({k: v.double() for k, v in grads.items()}, ref)
    assert err.max_rel_error < 1e-4, str(err)


def test_option_errors():
    with pytest.raises(ConfigError, match="unknown candidate 'log'"):
        MinGRU(5, 4, candidate="log")
    with pytest.raises(ConfigError, match="unknown output 'relu'"):
        MinGRU(5, 4, output="relu")
    with pytest.raises(ConfigError, match="unknown rule 'snap1'"):
        MinGRU(5, 4, "snap1")
    assert "candidate='g', output='tanh'" in repr(make_core("mingru-rtrl", 5, 4))


def test_stacked_joined_maps_are_views_in_the_agents_layout():
    """The stacked core reads [W_z; W_h] and [b_z; b_h] as views of the agent's flat rows
    (W_h laid out after W_z), and copies where they are apart; the values are the same."""
    from r2ac.rl.stream.nets import Layout
    from r2ac.rtrl.stacked import make_stacked_core
    from r2ac.rtrl.stacked.mingru import joined

    core = make_stacked_core("mingru-rtrl", 3, 5, 4, F64)
    layout = Layout(list(core.param_shapes().items()))
    flat = torch.randn(6, layout.size + 7, dtype=F64)[::2, 3 : 3 + layout.size]  # strided rows
    p = layout.views(flat)
    W, b = joined(p["W_z"], p["W_h"]), joined(p["b_z"], p["b_h"])
    assert W.data_ptr() == p["W_z"].data_ptr() and b.data_ptr() == p["b_z"].data_ptr()
    assert torch.equal(W, torch.cat([p["W_z"], p["W_h"]], 1))
    assert torch.equal(b, torch.cat([p["b_z"], p["b_h"]], 1))
    apart = joined(p["W_h"], p["W_z"])  # W_z does not follow W_h: a copy
    assert apart.data_ptr() != p["W_h"].data_ptr()
    assert torch.equal(apart, torch.cat([p["W_h"], p["W_z"]], 1))
