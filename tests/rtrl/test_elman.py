"""Elman RNN: full RTRL (per step and hybrid per segment) against BPTT, memory refusal, checks."""

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl import Elman, ElmanState
from r2ac.rtrl import elman as el
from r2ac.rtrl.gradcheck import (
    check_gradients,
    make_problem,
)
from r2ac.rtrl.reference import elman_reference

from .common import F64, PATTERNS


def make_layer(rule, D=5, N=4, seed=0, **kw):
    torch.manual_seed(seed)
    return Elman(D, N, rule, dtype=F64, **kw)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("batch", [1, 3])
def test_rtrl_equals_full_bptt_through_history(pattern, batch):
    result = check_gradients(
        make_layer("rtrl"), elman_reference, pattern, batch, reset_prob=0.15, seed=1
    )
    assert set(result.rel_error) == {"W", "R", "b"}
    assert result.max_rel_error < 1e-10, str(result)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_bptt_equals_truncated_bptt(pattern):
    result = check_gradients(
        make_layer("bptt"), elman_reference, pattern, 3, truncated=True, seed=2
    )
    assert result.max_rel_error < 1e-10, str(result)


def test_the_check_can_fail():
    err = check_gradients(
        make_layer("bptt"), elman_reference, PATTERNS[0], 3, reset_prob=0.0, seed=3
    )
    assert min(err.rel_error.values()) > 1e-2, str(err)


def test_hybrid_carry_equals_per_step_carry():
    torch.manual_seed(4)
    T, B, N, D = 6, 3, 4, 5
    M = D + N + 1
    sens = torch.randn(B, N, N, M, dtype=F64)
    R = torch.randn(N, N, dtype=F64)
    h_all = torch.rand(T, B, N, dtype=F64)
    u_all = torch.randn(T, B, M, dtype=F64)
    keep = torch.ones(T, B, 1, dtype=F64)
    keep[2, 1] = 0.0  # a reset inside the segment
    stepped = sens
    for t in range(T):
        stepped = el.carry_step(stepped, h_all[t], u_all[t], keep[t], R)
    whole = el.carry_segment(sens, h_all, u_all, keep, R)
    torch.testing.assert_close(whole, stepped, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        el.carry_segment(sens, h_all, u_all, None, R),
        _steps_no_keep(sens, h_all, u_all, R),
        rtol=1e-12,
        atol=1e-12,
    )


def _steps_no_keep(sens, h_all, u_all, R):
    for t in range(h_all.shape[0]):
        sens = el.carry_step(sens, h_all[t], u_all[t], None, R)
    return sens


def test_refuses_sizes_that_cannot_fit_naming_the_memory():
    with pytest.raises(
        ConfigError, match=r"N=8192, D=32\).* \(2,056.2 GiB in torch.float32\).*of memory of cpu"
    ):
        Elman(32, 8192, "rtrl")
    Elman(32, 4096, "bptt", dtype=torch.float16)  # no sensitivities: nothing to refuse
    layer = make_layer("rtrl", memory_limit=10_000)  # 2 x 1280 B per stream fits once ...
    layer.initial_state(3)
    with pytest.raises(ConfigError, match=r"20.0 KiB for 8 stream\(s\).*9.8 KiB of memory"):
        layer.initial_state(8)  # ... 8 streams do not


def test_forward_matches_reference_and_splitting_changes_nothing():
    layer = make_layer("rtrl")
    problem = make_problem(5, 4, (6, 1, 5), 3, reset_prob=0.2, seed=5)
    with torch.no_grad():
        y_ref, h_ref = elman_reference(dict(layer.named_parameters()), problem.x, problem.reset)
        state, outs = layer.initial_state(3), []
        for sl in (slice(0, 6), slice(6, 7), slice(7, 12)):
            y, state = layer(problem.x[sl], state, reset=problem.reset[sl])
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs), y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state.h, h_ref, rtol=1e-13, atol=1e-13)


def test_state_shapes_and_errors():
    layer = make_layer("rtrl")
    s = layer.initial_state(2)
    assert s.h.shape == (2, 4) and s.sens.shape == (2, 4, 4, 5 + 4 + 1)
    assert make_layer("bptt").initial_state(2).sens is None
    x = torch.zeros(3, 2, 5, dtype=F64)
    with pytest.raises(ValueError, match="state.sens has shape"):
        layer(x, ElmanState(s.h, torch.zeros(2, 4, 4, 9, dtype=F64)))
    with pytest.raises(ValueError, match="silently truncated"):
        layer(x, layer.initial_state(2, with_sensitivities=False))
    with pytest.raises(TypeError, match="ElmanState"):
        layer(x, (s.h,))
    with pytest.raises(ConfigError, match="unknown rule 'snap1'"):
        Elman(5, 4, "snap1")
