"""Standard LSTM baseline: truncated BPTT through PyTorch's kernel, chunked at resets."""

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl import LSTM, LSTMState
from r2ac.rtrl.gradcheck import (
    check_gradients,
    make_problem,
)
from r2ac.rtrl.reference import lstm_reference

from .common import F64, PATTERNS


def make_layer(D=5, N=4, seed=0):
    torch.manual_seed(seed)
    return LSTM(D, N, "bptt", dtype=F64)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("reset_prob", [0.0, 0.3])
def test_bptt_equals_truncated_bptt(pattern, reset_prob):
    result = check_gradients(
        make_layer(), lstm_reference, pattern, 3, truncated=True, reset_prob=reset_prob, seed=2
    )
    assert set(result.rel_error) == {"W_ih", "W_hh", "b"}
    assert result.max_rel_error < 1e-10, str(result)


def test_the_check_can_fail():
    err = check_gradients(make_layer(), lstm_reference, PATTERNS[0], 3, reset_prob=0.0, seed=3)
    assert min(err.rel_error.values()) > 1e-2, str(err)


def test_forward_matches_reference():
    layer = make_layer()
    problem = make_problem(5, 4, (6, 1, 5), 3, reset_prob=0.2, seed=5)
    with torch.no_grad():
        y_ref, (h_ref, c_ref) = lstm_reference(
            dict(layer.named_parameters()), problem.x, problem.reset
        )
        state, outs = layer.initial_state(3), []
        for sl in (slice(0, 6), slice(6, 7), slice(7, 12)):
            y, state = layer(problem.x[sl], state, reset=problem.reset[sl])
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs), y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state.c, c_ref, rtol=1e-13, atol=1e-13)


def test_errors():
    layer = make_layer()
    x = torch.zeros(3, 2, 5, dtype=F64)
    with pytest.raises(TypeError, match="LSTMState"):
        layer(x, (torch.zeros(2, 4, dtype=F64),))
    with pytest.raises(ValueError, match="state.c has shape"):
        layer(x, LSTMState(torch.zeros(2, 4, dtype=F64), torch.zeros(2, 5, dtype=F64)))
    with pytest.raises(ConfigError, match="unknown rule 'rtrl'"):
        LSTM(5, 4, "rtrl")
