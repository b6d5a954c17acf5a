"""eLSTM: exact RTRL and truncated BPTT gradients, state handling, and input checks."""

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl import ELSTM, ELSTMSensitivity, ELSTMState
from r2ac.rtrl.elstm import math as em
from r2ac.rtrl.gradcheck import (
    check_gradients,
    compare,
    layer_gradients,
    make_problem,
    reference_gradients,
)
from r2ac.rtrl.reference import elstm_reference
from r2ac.rtrl.registry import make_core

from .common import F64, PATTERNS

PARAMS = ("F", "Z", "O", "W_o", "w_f", "w_z", "b_f", "b_z", "b_o")


def make_layer(rule, D=5, N=4, seed=0, dtype=F64, **kw):
    torch.manual_seed(seed)
    return ELSTM(D, N, rule, dtype=dtype, **kw)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("batch", [1, 3])
def test_rtrl_equals_full_bptt_through_history(pattern, batch):
    result = check_gradients(
        make_layer("rtrl"), elstm_reference, pattern, batch, reset_prob=0.15, seed=1
    )
    assert set(result.rel_error) == set(PARAMS)
    assert result.max_rel_error < 1e-10, str(result)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("batch", [1, 3])
def test_bptt_equals_truncated_bptt(pattern, batch):
    result = check_gradients(
        make_layer("bptt"), elstm_reference, pattern, batch, truncated=True, seed=2
    )
    assert result.max_rel_error < 1e-10, str(result)


def test_the_check_can_fail():
    """Truncation makes a real difference on this problem, so the two tests above have teeth."""
    err = check_gradients(
        make_layer("bptt"), elstm_reference, PATTERNS[0], 3, reset_prob=0.0, seed=3
    )
    assert err.rel_error["F"] > 1e-2 and err.rel_error["w_f"] > 1e-2
    assert err.rel_error["O"] < 1e-10  # the output gate is not recurrent: BPTT is already exact


def test_reset_on_every_first_step_makes_rtrl_equal_truncated():
    layer = make_layer("rtrl")
    problem = make_problem(5, 4, (4, 4, 4), 2, reset_prob=0.0, seed=4)
    problem.reset[[0, 4, 8]] = True
    ref = reference_gradients(
        elstm_reference, dict(layer.named_parameters()), problem, truncated=True
    )
    assert compare(layer_gradients(layer, problem), ref).max_rel_error < 1e-10


def test_segment_carry_equals_step_by_step_carry():
    torch.manual_seed(6)
    T, B, N, D = 7, 3, 4, 5
    sens = ELSTMSensitivity(torch.randn(B, 2, N, D, dtype=F64), torch.randn(B, 4, N, dtype=F64))
    trace = em.RecurrenceTrace(*(torch.rand(T, B, N, dtype=F64) for _ in range(4)))
    trace.a[2, 1] = 0.0  # a reset inside the segment
    x = torch.randn(T, B, D, dtype=F64)
    stepped = sens
    for t in range(T):
        stepped = em.carry_step(
            stepped, em.RecurrenceTrace(*(v[t : t + 1] for v in trace)), x[t : t + 1]
        )
    whole = em.carry_segment(sens, trace, x)
    torch.testing.assert_close(whole.FZ, stepped.FZ, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(whole.wb, stepped.wb, rtol=1e-12, atol=1e-12)


def test_storage_layout_changes_no_number():
    """FZ in the layer's (B, D, 2, N) storage and as a plain (B, 2, N, D) tensor: the carries
    (segment and step) and the history gradient agree, and the carry keeps the fast layout."""
    torch.manual_seed(8)
    T, B, N, D = 6, 3, 4, 5
    plain = ELSTMSensitivity(torch.randn(B, 2, N, D, dtype=F64), torch.randn(B, 4, N, dtype=F64))
    stored = ELSTMSensitivity(em.zero_FZ(B, N, D, dtype=F64).copy_(plain.FZ), plain.wb)
    assert not stored.FZ.is_contiguous() and stored.FZ.permute(0, 3, 1, 2).is_contiguous()
    trace = em.RecurrenceTrace(*(torch.rand(T, B, N, dtype=F64) for _ in range(4)))
    x = torch.randn(T, B, D, dtype=F64)
    d_hat = torch.randn(B, N, dtype=F64)
    for carry in (
        lambda s: em.carry_segment(s, trace, x),
        lambda s: em.carry_step(s, trace, x[:1]),
    ):
        a, b = carry(plain), carry(stored)
        torch.testing.assert_close(a.FZ, b.FZ, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(a.wb, b.wb, rtol=1e-13, atol=1e-13)
        assert b.FZ.permute(0, 3, 1, 2).is_contiguous()
    for got, want in zip(em.inject_gradients(d_hat, stored), em.inject_gradients(d_hat, plain)):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    want = torch.einsum("bn,bknd->knd", d_hat, plain.FZ)  # straight from the definition
    torch.testing.assert_close(em.inject_gradients(d_hat, stored)[0], want, rtol=1e-13, atol=1e-13)


def test_fused_step_carry_is_exact():
    pytest.importorskip("torch._inductor")
    layer = make_layer("rtrl", fused_step=True, inplace_carry=False)  # the eager carry path
    result = check_gradients(layer, elstm_reference, (1, 1, 2, 1, 1), 2, seed=7)
    assert result.max_rel_error < 1e-10, str(result)


def test_forward_matches_reference_and_splitting_changes_nothing():
    layer = make_layer("rtrl")
    problem = make_problem(5, 4, (6, 1, 5), 3, reset_prob=0.2, seed=8)
    params = dict(layer.named_parameters())
    with torch.no_grad():
        h_ref, c_ref = elstm_reference(params, problem.x, problem.reset)
        state, outs = layer.initial_state(3), []
        for sl in (slice(0, 6), slice(6, 7), slice(7, 12)):
            h, state = layer(problem.x[sl], state, reset=problem.reset[sl])
            outs.append(h)
    torch.testing.assert_close(torch.cat(outs), h_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state.c, c_ref, rtol=1e-13, atol=1e-13)


def test_reset_stream_equals_fresh_start():
    layer = make_layer("bptt")
    x = torch.randn(6, 2, 5, dtype=F64)
    reset = torch.zeros(6, 2, dtype=torch.bool)
    reset[3, 0] = True
    warm = ELSTMState(torch.randn(2, 4, dtype=F64), None)
    with torch.no_grad():
        h, _ = layer(x, warm, reset=reset)
        fresh, _ = layer(x[3:, :1], layer.initial_state(1))
    torch.testing.assert_close(h[3:, :1], fresh, rtol=1e-13, atol=1e-13)
    assert not torch.allclose(h[:3, 1], layer(x[:3, 1:], layer.initial_state(1))[0][:, 0])


def test_state_is_detached_and_inputs_untouched():
    layer = make_layer("rtrl")
    state = layer.initial_state(2)
    state = ELSTMState(
        torch.randn(2, 4, dtype=F64),
        ELSTMSensitivity(torch.randn(2, 2, 4, 5, dtype=F64), torch.randn(2, 4, 4, dtype=F64)),
    )
    before = [t.clone() for t in (state.c, state.sens.FZ, state.sens.wb)]
    x = torch.randn(3, 2, 5, dtype=F64, requires_grad=True)
    h, new = layer(x, state)
    h.sum().backward()
    for t, b in zip((state.c, state.sens.FZ, state.sens.wb), before):
        assert torch.equal(t, b)
    assert not new.c.requires_grad and not new.sens.FZ.requires_grad
    # input gradients are truncated at the segment start under both rules
    x_bptt = x.detach().clone().requires_grad_(True)
    bptt = make_layer("bptt")
    bptt.load_state_dict(layer.state_dict())
    bptt(x_bptt, ELSTMState(state.c, None))[0].sum().backward()
    torch.testing.assert_close(x.grad, x_bptt.grad, rtol=1e-13, atol=1e-13)


def test_initial_state_shapes():
    layer = make_layer("rtrl")
    s = layer.initial_state(3)
    assert s.c.shape == (3, 4) and s.sens.FZ.shape == (3, 2, 4, 5) and s.sens.wb.shape == (3, 4, 4)
    assert float(s.c.abs().sum() + s.sens.FZ.abs().sum()) == 0.0
    assert layer.initial_state(3, with_sensitivities=False).sens is None
    assert make_layer("bptt").initial_state(2).sens is None


def test_light_state_acting_without_grad_and_refused_with_grad():
    layer = make_layer("rtrl")
    light = layer.initial_state(2, with_sensitivities=False)
    x = torch.randn(1, 2, 5, dtype=F64)
    with torch.no_grad():
        _, s = layer(x, light)
    assert s.sens is None
    with pytest.raises(ValueError, match="silently truncated"):
        layer(x, light)


@pytest.mark.parametrize(
    "x_shape, reset, match",
    [
        ((3, 2), None, "must be a \\(T, B, D=5\\)"),
        ((3, 2, 6), None, "6 features"),
        ((0, 2, 5), None, "T >= 1"),
        ((3, 2, 5), torch.zeros(3, 3, dtype=torch.bool), "reset must be a \\(T=3, B=2\\)"),
    ],
)
def test_bad_shapes(x_shape, reset, match):
    layer = make_layer("rtrl")
    with pytest.raises(ValueError, match=match):
        layer(torch.zeros(x_shape, dtype=F64), layer.initial_state(2), reset=reset)


def test_bad_state_dtype_rule():
    layer = make_layer("rtrl")
    x = torch.zeros(3, 2, 5, dtype=F64)
    with pytest.raises(ValueError, match="state.c has shape"):
        layer(x, layer.initial_state(3))
    with pytest.raises(TypeError, match="dtype torch.float32"):
        layer(x.float(), layer.initial_state(2))
    with pytest.raises(TypeError, match="reset must have dtype torch.bool"):
        layer(x, layer.initial_state(2), reset=torch.zeros(3, 2))
    with pytest.raises(TypeError, match="ELSTMState"):
        layer(x, (torch.zeros(2, 4, dtype=F64),))
    with pytest.raises(ConfigError, match="unknown rule 'tbptt'"):
        ELSTM(5, 4, "tbptt")
    with pytest.raises(ValueError, match="sizes must be positive"):
        ELSTM(0, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_cuda_matches_cpu(dtype):
    cpu = make_layer("rtrl", dtype=dtype)
    gpu = make_layer("rtrl", dtype=dtype).cuda()
    problem = make_problem(5, 4, (3, 1, 4), 3, seed=9, dtype=dtype)
    g_cpu = layer_gradients(cpu, problem)
    prob_gpu = type(problem)(
        problem.x.cuda(), problem.reset.cuda(), problem.readout.cuda(), problem.segment_lengths
    )
    g_gpu = layer_gradients(gpu, prob_gpu)
    tol = 1e-10 if dtype == F64 else 1e-4
    assert compare({k: v.cpu() for k, v in g_gpu.items()}, g_cpu).max_rel_error < tol


def test_skipping_the_carry_changes_no_gradient():
    layer = make_layer("rtrl")
    state = ELSTMState(
        torch.randn(2, 4, dtype=F64),
        ELSTMSensitivity(torch.randn(2, 2, 4, 5, dtype=F64), torch.randn(2, 4, 4, dtype=F64)),
    )
    x = torch.randn(3, 2, 5, dtype=F64)
    grads = []
    for carry in (True, False):
        layer.zero_grad()
        h, new = layer(x, state, carry=carry)
        h.sum().backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
        assert (new.sens is None) == (not carry)
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("T", [1, 6])
def test_advance_state_equals_forward_state(T):
    layer = make_layer("rtrl")
    state = ELSTMState(
        torch.randn(3, 4, dtype=F64),
        ELSTMSensitivity(torch.randn(3, 2, 4, 5, dtype=F64), torch.randn(3, 4, 4, dtype=F64)),
    )
    x = torch.randn(T, 3, 5, dtype=F64)
    reset = torch.zeros(T, 3, dtype=torch.bool)
    reset[T // 2, 1] = True
    with torch.no_grad():
        _, want = layer(x, state, reset=reset)
    got = layer.advance_state(x, state, reset=reset)
    for a, b in zip((want.c, *want.sens), (got.c, *got.sens)):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("rule", ["bptt", "rtrl"])
def test_input_gradient_equals_autograd_through_the_segment(rule):
    """dL/dx from the hand-written backward equals plain autograd through the equations (the
    state detached at the segment start), with a reset inside the segment: what a trainable
    stem below the core receives."""
    layer = make_layer(rule)
    gen = torch.Generator().manual_seed(3)
    state = layer.initial_state(2)
    state = ELSTMState(torch.randn(2, 4, dtype=F64, generator=gen), state.sens)
    reset = torch.zeros(6, 2, dtype=torch.bool)
    reset[2, 1] = True
    x = torch.randn(6, 2, 5, dtype=F64, generator=gen, requires_grad=True)
    readout = torch.randn(6, 2, 4, dtype=F64, generator=gen)
    (layer(x, state, reset=reset)[0] * readout).sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    h_ref, _ = elstm_reference(params, x_ref, reset, state.c)
    (h_ref * readout).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-12, atol=1e-13)


def _elstm_run(core, x, reset, state=None):
    """The state after x (T, B, D) in segments of 4 steps from the zero state."""
    state = core.initial_state(x.shape[1]) if state is None else state
    for s in range(0, x.shape[0], 4):
        _, state = core(x[s : s + 4], state, reset[s : s + 4])
    return state


def test_the_first_order_start_is_the_derivative_of_the_carried_state():
    """c(t0; theta + e delta) = c(t0) + e S(t0) . delta + O(e^2), float64, with episode resets
    inside the segments: central differences agree to ~e^2, one-sided errors shrink as e^2;
    both layouts of FZ give the same numbers (D = 21: the stored layout's sum runs over two
    blocks of inputs, one of them partial)."""
    torch.manual_seed(0)
    T, B, D, N = 12, 3, 21, 7
    core = ELSTM(D, N, "rtrl", dtype=torch.float64, inplace_carry=False)
    x = torch.randn(T, B, D, dtype=torch.float64)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[5, 1] = reset[9, 0] = True
    with torch.no_grad():
        state = _elstm_run(core, x, reset)
        snapshot = core.recurrent_snapshot()
        params = [core.F, core.Z, core.w_f, core.w_z, core.b_f, core.b_z]
        delta = [torch.randn_like(p) for p in params]

        def moved(e):  # the state's c at theta + e delta, and first_order_start's prediction
            for p, d in zip(params, delta):
                p.add_(e * d)
            c, predicted = _elstm_run(core, x, reset).c, core.first_order_start(state, snapshot)
            for p, d in zip(params, delta):
                p.sub_(e * d)
            return c, predicted.c

        slope = (moved(1e-6)[0] - moved(-1e-6)[0]) / 2e-6
        c_hi, predicted_hi = moved(1e-3)
        c_lo, predicted_lo = moved(1e-4)
        d_FZ, d_wb = torch.stack(delta[:2]), torch.stack(delta[2:])
        plain = em.ELSTMSensitivity(state.sens.FZ.contiguous(), state.sens.wb)  # (B, 2, N, D)
        plain_slope = em.first_order_start(plain, d_FZ, d_wb)
    linear = em.first_order_start(state.sens, d_FZ, d_wb)
    assert (slope - linear).abs().max() < 1e-8 * linear.abs().max()
    assert (plain_slope - linear).abs().max() < 1e-13 * linear.abs().max()
    err_hi, err_lo = (c_hi - predicted_hi).abs().max(), (c_lo - predicted_lo).abs().max()
    assert 70 < err_hi / err_lo < 130  # second order: 10x smaller step, 100x smaller error
    assert err_hi < 1e-2 * (c_hi - state.c).abs().max()  # 100x closer than the stale state
    light = core.light_state(state)
    assert core.first_order_start(light, snapshot) is light
    with pytest.raises(NotImplementedError, match="GRU has no first-order start"):
        make_core("gru-bptt", D, N).recurrent_snapshot()
