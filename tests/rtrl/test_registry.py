"""Every core by name: the common contract (state pytree, resets, truncation of input grads)."""

import pytest
import torch
from torch.utils import _pytree as pytree

from r2ac.errors import ConfigError
from r2ac.rtrl import CORES, core_names, make_core
from r2ac.rtrl.elstm.deferred import ConsumedStateError
from r2ac.rtrl.gradcheck import compare, layer_gradients, make_problem, reference_gradients
from r2ac.rtrl.reference import (
    elman_reference,
    elstm_reference,
    felstm_reference,
    fwp_reference,
    gru_reference,
    lru_reference,
    lstm_reference,
    mingru_reference,
    rtu_reference,
)
from r2ac.rtrl.state import cat_streams, select_streams

F64 = torch.float64
NAMES = core_names()
REFERENCES = {
    "elstm": elstm_reference,
    "felstm": felstm_reference,
    "fwp": fwp_reference,
    "elman": elman_reference,
    "lstm": lstm_reference,
    "gru": gru_reference,
}
REFERENCES.update(rtu=rtu_reference, lru=lru_reference, mingru=mingru_reference)
D, N = 5, 4


def make(name, seed=0):
    torch.manual_seed(seed)
    return make_core(name, D, N, dtype=F64)


def leaves(state):
    return [t for t in pytree.tree_leaves(state) if t is not None]


def test_names():
    assert set(NAMES) == {
        "elstm-rtrl",
        "elstm-bptt",
        "elstm-snap1",
        "felstm-bptt",
        "felstm-snap1",
        "lstm-bptt",
        "gru-bptt",
        "fwp-rtrl",
        "fwp-bptt",
        "elman-rtrl",
        "elman-bptt",
        "rtu-rtrl",
        "rtu-bptt",
        "lru-rtrl",
        "lru-bptt",
        "mingru-rtrl",
        "mingru-bptt",
    }
    assert all(spec.description for spec in CORES.values())
    with pytest.raises(ConfigError, match="unknown core 'gru-rtrl'"):
        make_core("gru-rtrl", D, N)
    with pytest.raises(ConfigError, match="must be positive"):
        make_core("fwp-rtrl", 0, N)


@pytest.mark.parametrize("name", NAMES)
def test_contract(name):
    core = make(name)
    assert (core.input_size, core.hidden_size) == (D, N)
    assert core.rule == name.split("-")[1]
    state = core.initial_state(3)
    assert all(t.shape[0] == 3 and float(t.abs().sum()) == 0.0 for t in leaves(state))
    x = torch.randn(4, 3, D, dtype=F64, requires_grad=True)
    y, new = core(x, state)
    assert y.shape == (4, 3, N) and y.dtype == F64
    assert type(new) is type(state)
    assert all(t.shape[0] == 3 and not t.requires_grad for t in leaves(new))
    assert [t.shape for t in leaves(new)] == [t.shape for t in leaves(state)]
    with torch.no_grad():  # acting with a light state (no sensitivities) works for every core
        y_light, _ = core(x, core.initial_state(3, with_sensitivities=False))
    torch.testing.assert_close(y_light, y.detach(), rtol=1e-13, atol=1e-13)
    y.sum().backward()
    assert all(p.grad is not None for p in core.parameters())
    # per-stream indexing works generically on any core's state
    assert [t.shape[0] for t in leaves(select_streams(new, torch.tensor([0, 2])))] == [2] * len(
        leaves(new)
    )
    joined = cat_streams([select_streams(new, slice(0, 1)), select_streams(new, slice(1, 3))])
    assert all(torch.equal(a, b) for a, b in zip(leaves(joined), leaves(new)))


@pytest.mark.parametrize("name", NAMES)
def test_reset_stream_equals_fresh_start_and_state_untouched(name):
    core = make(name)
    x = torch.randn(6, 2, D, dtype=F64)
    with torch.no_grad():
        _, warm = core(torch.randn(5, 2, D, dtype=F64), core.initial_state(2))
    before = [t.clone() for t in leaves(warm)]
    reset = torch.zeros(6, 2, dtype=torch.bool)
    reset[3, 0] = True
    y, after = core(x, warm, reset=reset)
    assert all(torch.equal(a, b) for a, b in zip(leaves(warm), before))  # forward touches nothing
    y.sum().backward()
    if getattr(core, "inplace_carry", False) and core.rule != "bptt":  # carried over warm
        with pytest.raises(ConsumedStateError, match="overwritten in place"):
            core(x, warm)
    else:
        assert all(torch.equal(a, b) for a, b in zip(leaves(warm), before))
    with torch.no_grad():
        fresh, fresh_state = core(x[3:, :1], core.initial_state(1))
    torch.testing.assert_close(y[3:, :1].detach(), fresh, rtol=1e-13, atol=1e-13)
    for a, b in zip(leaves(select_streams(after, slice(0, 1))), leaves(fresh_state)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_input_gradients_are_truncated_at_the_segment_start(name):
    """x.grad is the same whatever the rule: BPTT inside the segment only."""
    core = make(name)
    kind = name.split("-")[0]
    trunc = make_core(f"{kind}-bptt", D, N, dtype=F64)
    trunc.load_state_dict(core.state_dict())
    with torch.no_grad():
        _, warm = core(torch.randn(5, 2, D, dtype=F64), core.initial_state(2))
    warm_trunc = trunc.initial_state(2)
    warm_trunc = type(warm_trunc)(
        *(
            getattr(warm, f) if getattr(warm_trunc, f) is not None else None
            for f in warm_trunc._fields
        )
    )
    grads = []
    for layer, state in ((core, warm), (trunc, warm_trunc)):
        x = torch.randn(
            4, 2, D, dtype=F64, generator=torch.Generator().manual_seed(1)
        ).requires_grad_(True)
        (layer(x, state)[0] ** 2).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        core.initial_state(0)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "felstm-snap1"])  # dense: approximate
def test_float32_against_float64_reference(name):
    """float32 gradients over a 24-step history with resets: < 1e-4 relative to float64."""
    kind, rule = name.split("-")
    torch.manual_seed(0)
    layer = make_core(name, D, N, dtype=torch.float32)
    problem = make_problem(D, N, (6, 1, 9, 8), 3, seed=5, dtype=torch.float32)
    grads = layer_gradients(layer, problem)
    p64 = {k: v.detach().double() for k, v in layer.named_parameters()}
    prob64 = type(problem)(
        problem.x.double(), problem.reset, problem.readout.double(), problem.segment_lengths
    )
    ref = reference_gradients(REFERENCES[kind], p64, prob64, truncated=rule == "bptt")
    err = compare({k: v.double() for k, v in grads.items()}, ref)
    assert err.max_rel_error < 1e-4, str(err)


def test_the_memoryless_core_is_a_registry_row():
    assert "feedforward" not in NAMES and "feedforward" in core_names(include_memoryless=True)
    core = make_core("feedforward", D, N, dtype=F64)
    x = torch.randn(3, 2, D, dtype=F64)
    y, state = core(x, core.initial_state(2))
    assert y.shape == (3, 2, N) and state == () and float(y.min()) >= 0.0
