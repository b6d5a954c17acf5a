"""The core contract, for every core in the registry (docs/architecture.md, "Adding a core").

Each test is parametrized over `core_names()`, so a new registry line is tested here without
touching this file. What a core needs beyond its class and its registry line: a slow
reference `<family>_reference` in r2ac/rtrl/reference.py, with the core's parameter names.
"""

import pytest
import torch
from torch.utils import _pytree as pytree

from r2ac.errors import ConfigError
from r2ac.rtrl import CORES, ConsumedStateError, RecurrentCore, core_names, make_core, reference
from r2ac.rtrl.gradcheck import (
    check_gradients,
    compare,
    layer_gradients,
    make_problem,
    reference_gradients,
)
from r2ac.rtrl.state import cat_keeping_layout, cat_streams, select_streams, write_state

from .common import ACT_CALLS, ACT_RESETS, act_segment, max_rel_error

F32, F64 = torch.float32, torch.float64
NAMES = core_names()
D, N = 5, 4
# Mixed segment lengths with per-step (T = 1) segments in between.
PATTERNS = [(3, 1, 5, 1, 7), (2, 9, 1, 6)]


def make(name, dtype=F64, seed=0, **kw) -> RecurrentCore:
    torch.manual_seed(seed)
    return make_core(name, D, N, dtype=dtype, **kw)


def leaves(state):
    return [t for t in pytree.tree_leaves(state) if t is not None]


def reference_of(name):
    family = name.split("-")[0]
    ref = getattr(reference, f"{family}_reference", None)
    assert ref is not None, f"{name}: add {family}_reference to r2ac/rtrl/reference.py"
    return ref


def warm_state(core, B, seed=1):
    """A state with non-zero entries everywhere (zero states hide indexing mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, B, D, dtype=next(core.parameters()).dtype, generator=gen)
    with torch.no_grad():
        return core(x, core.initial_state(B))[1]


def bptt_twin(name):
    """The same family's "bptt" core with the weights of `make(name)` (skips if none)."""
    twin_name = name.split("-")[0] + "-bptt"
    if twin_name not in CORES:
        pytest.skip(f"no {twin_name} to compare with")
    twin = make(twin_name)
    twin.load_state_dict(make(name).state_dict())
    return twin


def segment(T, B, dtype=F64, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, D, dtype=dtype, generator=gen)


def test_registry_builds_recurrent_cores():
    assert NAMES == sorted(n for n in CORES if CORES[n].rule) and len(NAMES) >= 10
    for name in NAMES:
        core = make(name)
        assert isinstance(core, RecurrentCore), name
        assert (core.input_size, core.hidden_size) == (D, N)
        assert core.rule == name.split("-", 1)[1] and core.rule in core.RULES


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", NAMES)
def test_shapes_dtypes_and_detached_state(name, dtype):
    core = make(name, dtype)
    state = core.initial_state(3)
    assert isinstance(state, core.State)
    assert all(
        t.shape[0] == 3 and t.dtype == dtype and float(t.abs().sum()) == 0 for t in leaves(state)
    )
    x = segment(4, 3, dtype).requires_grad_(True)
    y, new = core(x, state)
    assert y.shape == (4, 3, N) and y.dtype == dtype
    assert type(new) is type(state)
    assert [t.shape for t in leaves(new)] == [t.shape for t in leaves(state)]
    assert all(t.dtype == dtype and not t.requires_grad for t in leaves(new))
    y.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == dtype for p in core.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_splitting_a_segment_changes_nothing(name):
    """Outputs and end state of one segment equal those of its two halves (no grad)."""
    core = make(name)
    state, x = warm_state(core, 2), segment(7, 2)
    reset = torch.zeros(7, 2, dtype=torch.bool)
    reset[2, 0] = reset[4, 1] = True
    with torch.no_grad():
        y, end = core(x, state, reset=reset)
        y1, mid = core(x[:3], state, reset=reset[:3])
        y2, end2 = core(x[3:], mid, reset=reset[3:])
    torch.testing.assert_close(torch.cat([y1, y2]), y, rtol=1e-12, atol=1e-13)
    for a, b in zip(leaves(end2), leaves(end)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_reset_inside_a_segment_equals_a_fresh_start(name):
    core = make(name)
    warm, x = warm_state(core, 2), segment(6, 2)
    before = [t.clone() for t in leaves(warm)]
    reset = torch.zeros(6, 2, dtype=torch.bool)
    reset[3, 0] = True
    y, after = core(x, warm, reset=reset)
    assert all(torch.equal(a, b) for a, b in zip(leaves(warm), before))  # forward writes nothing
    with torch.no_grad():
        fresh, fresh_state = core(x[3:, :1], core.initial_state(1))
    torch.testing.assert_close(y[3:, :1].detach(), fresh, rtol=1e-13, atol=1e-13)
    for a, b in zip(leaves(select_streams(after, slice(0, 1))), leaves(fresh_state)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    with torch.no_grad():
        y_carried, _ = core(x, warm)
    assert not torch.allclose(y_carried[3:, :1], fresh)  # so the test has teeth: warm matters


@pytest.mark.parametrize("name", NAMES)
def test_state_is_consumed_only_by_an_in_place_carry(name):
    core = make(name)
    warm, x = warm_state(core, 2), segment(4, 2)
    before = [t.clone() for t in leaves(warm)]
    y, _after = core(x, warm)
    y.sum().backward()
    if getattr(core, "inplace_carry", False) and core.carries_sensitivities:
        with pytest.raises(ConsumedStateError, match="overwritten in place"):
            core(x, warm)
    else:  # every other core leaves its input state intact
        assert all(torch.equal(a, b) for a, b in zip(leaves(warm), before))


@pytest.mark.parametrize("name", NAMES)
def test_state_helpers_select_and_join_streams(name):
    core = make(name)
    state = warm_state(core, 3)
    picked = select_streams(state, torch.tensor([0, 2]))
    assert [t.shape[0] for t in leaves(picked)] == [2] * len(leaves(state))
    joined = cat_streams([select_streams(state, slice(0, 1)), select_streams(state, slice(1, 3))])
    assert all(torch.equal(a, b) for a, b in zip(leaves(joined), leaves(state)))
    # Leaves stored batch-outermost in a permuted layout (the eLSTM's FZ blocks) are joined
    # in that layout, so the kernels that want the layer's layout still take the batch.
    for a, b in zip(leaves(cat_streams([state, state])), leaves(state)):
        ordered = sorted(range(b.dim()), key=lambda d: -b.stride(d))
        if ordered[0] == 0 and b.permute(ordered).is_contiguous():
            assert a.permute(ordered).is_contiguous()


def test_cat_keeping_layout_joins_in_the_parts_layout():
    blocks = [
        torch.randn(b, 5, 2, 3, dtype=F64).permute(0, 2, 3, 1) for b in (2, 3)
    ]  # (b, 2, 3, 5)
    joined = cat_keeping_layout(blocks)
    assert torch.equal(joined, torch.cat(blocks)) and joined.permute(0, 3, 1, 2).is_contiguous()
    mixed = [blocks[0], torch.randn(3, 2, 3, 5, dtype=F64)]  # layouts differ: plain cat
    assert torch.equal(cat_keeping_layout(mixed), torch.cat(mixed))
    columns = [torch.randn(4, b, dtype=F64).t() for b in (2, 3)]  # dim 0 innermost: plain cat
    assert torch.equal(cat_keeping_layout(columns), torch.cat(columns))


@pytest.mark.parametrize("name", NAMES)
def test_light_state_advance_state_and_skipping_the_carry(name):
    """What an actor calls: act with light_state under no_grad, then advance_state once."""
    core = make(name)
    state, x = warm_state(core, 2), segment(4, 2)
    light = core.light_state(state)
    if not core.carries_sensitivities:
        assert light is state  # nothing to drop: the actor carries the state while acting
    with torch.no_grad():
        y_full, want = core(x, state)
        y_light, _ = core(x, light)
    torch.testing.assert_close(y_light, y_full, rtol=1e-13, atol=1e-13)
    got = core.advance_state(x, state)
    assert type(got) is type(want)
    for a, b in zip(leaves(got), leaves(want)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    y_skip, skipped = core(x, state, carry=False)
    torch.testing.assert_close(y_skip.detach(), y_full, rtol=1e-13, atol=1e-13)
    if core.skips_carry and core.carries_sensitivities:  # the sensitivities are left out
        assert len(leaves(skipped)) < len(leaves(want))
    else:  # carry=False is accepted and changes nothing
        assert all(torch.equal(a, b) for a, b in zip(leaves(skipped), leaves(want)))


@pytest.mark.parametrize("name", NAMES)
def test_act_and_carry_traces_equal_forward_and_advance_state(name):
    """The actor's path, over three segments: `act` from the light state (mixed call lengths,
    resets anywhere) gives forward's outputs, and `carry_traces` from the full start state
    gives advance_state's state (float64, < 1e-12 relative) and leaves the start intact."""
    core = make(name)
    got = want = warm_state(core, 3)
    reset = torch.zeros(sum(ACT_CALLS), 3, dtype=torch.bool)
    for t, b in ACT_RESETS:
        reset[t, b] = True
    for k in range(3):
        x = segment(sum(ACT_CALLS), 3, seed=10 + k)
        before = [t.clone() for t in leaves(got)]
        y, light, traces = act_segment(core, got, x, reset)
        with torch.no_grad():
            y_want, end = core(x, got, reset=reset)
        torch.testing.assert_close(y, y_want, rtol=1e-13, atol=1e-13)
        for a, b in zip(leaves(light), leaves(core.light_state(end)), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
        start, got = got, core.carry_traces(got, traces)
        assert all(torch.equal(a, b) for a, b in zip(leaves(start), before))  # left intact
        want = core.advance_state(x, want, reset=reset)
        assert type(got) is type(want)
        assert len(leaves(got)) == len(leaves(want))
        for a, b in zip(leaves(got), leaves(want)):
            assert max_rel_error(a, b) < 1e-12, (name, k, max_rel_error(a, b))
    assert all(float(t.abs().sum()) > 0 for t in leaves(got))


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", NAMES)
def test_carry_traces_into_out_writes_the_same_state_there(name, dtype):
    """`carry_traces(..., out=slice of a batch buffer)` returns `out` holding exactly what the
    carry without `out` returns (float32 takes the eLSTM's native kernel, which writes into
    `out` itself), the start state intact and the rest of the buffer untouched."""
    core = make(name, dtype)
    start = warm_state(core, 3)
    reset = torch.zeros(sum(ACT_CALLS), 3, dtype=torch.bool)
    reset[2, 1] = True
    _, _, traces = act_segment(core, start, segment(sum(ACT_CALLS), 3, dtype), reset)
    want = core.carry_traces(start, traces)
    buffer = core.initial_state(7)
    out = select_streams(buffer, slice(2, 5))
    before = [t.clone() for t in leaves(start)]
    got = core.carry_traces(start, traces, out=out)
    assert got is out
    for a, b in zip(leaves(got), leaves(want), strict=True):
        assert torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(leaves(start), before, strict=True))
    for t in leaves(buffer):  # the streams outside the slice stay zero
        assert float(t[:2].abs().sum()) == 0 and float(t[5:].abs().sum()) == 0
    with pytest.raises(ValueError, match="same core and streams"):
        core.carry_traces(start, traces, out=core.initial_state(4))


def test_the_native_carry_writes_into_out_in_place_and_refuses_overlap(monkeypatch):
    """The eLSTM's native carry (float32, CPU, the layer's layout) is given `out`'s memory to
    write into (nothing to copy after it): the state it carries from itself (in place, the
    serial runtime's deferred carry) gives the same numbers; an `out` that overlaps that
    state otherwise is refused."""
    from r2ac.rtrl.elstm import native

    torch.manual_seed(0)
    core = make_core("elstm-rtrl", D, 8, dtype=F32)  # the kernel wants N % 8 == 0
    if native.load() is None:
        pytest.skip("native eLSTM kernel not built on this machine")
    no_reset = torch.zeros(sum(ACT_CALLS), 3, dtype=torch.bool)
    x = segment(sum(ACT_CALLS), 3, F32)
    start = core.initial_state(3)
    start = core.carry_traces(start, act_segment(core, start, x, no_reset)[2])  # non-zero
    _, _, traces = act_segment(core, start, x, no_reset)
    want = core.carry_traces(start, traces)
    given = []
    kernel = native.carry_from_gates
    monkeypatch.setattr(
        native, "carry_from_gates", lambda *a, out=None: given.append(out) or kernel(*a, out=out)
    )
    out = core.initial_state(3)
    got = core.carry_traces(start, traces, out=out)
    assert len(given) == 1 and given[0][0].data_ptr() == out.sens.FZ.data_ptr()
    assert got is out and float(out.sens.FZ.abs().sum()) > 0
    assert all(torch.equal(a, b) for a, b in zip(leaves(got), leaves(want), strict=True))
    buffer = core.initial_state(4)
    shifted = [select_streams(buffer, slice(k, k + 3)) for k in (0, 1)]
    write_state(shifted[0], start)
    with pytest.raises(ValueError, match="shares memory"):
        core.carry_traces(shifted[0], traces, out=shifted[1])
    in_place = core.carry_traces(start, traces, out=start, weights=core.carry_weights())
    assert in_place is start and given[-1][0].data_ptr() == start.sens.FZ.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(leaves(start), leaves(want), strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_state_checks_and_their_errors(name):
    core = make(name)
    state = core.initial_state(2)
    x = segment(3, 2)
    with pytest.raises(TypeError, match=core.State.__name__):
        core(x, tuple(state))
    with pytest.raises(ValueError, match="has shape"):
        core(x, core.initial_state(3))
    with pytest.raises(TypeError, match="dtype"):
        core(x, make(name, F32).initial_state(2))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        core.initial_state(0)
    if core.carries_sensitivities:
        with pytest.raises(ValueError, match="silently truncated"):
            core(x, core.light_state(state))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "x_shape, reset, error, match",
    [
        ((3, 2), None, ValueError, "must be a \\(T, B, D=5\\)"),
        ((3, 2, 6), None, ValueError, "6 features"),
        ((0, 2, 5), None, ValueError, "T >= 1"),
        (
            (3, 2, 5),
            torch.zeros(3, 3, dtype=torch.bool),
            ValueError,
            "reset must be a \\(T=3, B=2\\)",
        ),
        ((3, 2, 5), torch.zeros(3, 2), TypeError, "reset must have dtype torch.bool"),
    ],
)
def test_input_checks(name, x_shape, reset, error, match):
    core = make(name)
    with pytest.raises(error, match=match):
        core(torch.zeros(x_shape, dtype=F64), core.initial_state(2), reset=reset)
    with pytest.raises(TypeError, match="dtype torch.float32"):
        core(torch.zeros(3, 2, 5), core.initial_state(2))
    with pytest.raises(ValueError, match="has shape"):
        core(torch.zeros(3, 2, 5, dtype=F64), core.initial_state(3))


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("name", NAMES)
def test_gradient_against_the_slow_reference(name, pattern):
    """float64, segment by segment with resets anywhere: exact rules match full BPTT (or, for
    "bptt", BPTT truncated at segment starts) of the reference to 1e-10."""
    core = make(name)
    result = check_gradients(
        core, reference_of(name), pattern, 3, truncated=core.rule == "bptt", seed=4
    )
    assert set(result.rel_error) == {k for k, _ in core.named_parameters()}
    if core.exact_gradient:
        assert result.max_rel_error < 1e-10, str(result)
    else:  # an approximate rule: close, and measurably not exact (else it should say so)
        assert 1e-10 < result.max_rel_error < 0.5, str(result)


@pytest.mark.parametrize("name", NAMES)
def test_input_gradient_is_truncated_at_the_segment_start(name):
    """x.grad is the same whatever the rule: BPTT inside the segment only (against the same
    family's "bptt" core with the same weights and the same light state)."""
    core, twin = make(name), bptt_twin(name)
    state = warm_state(core, 2)
    grads = []
    for layer, start in ((core, state), (twin, core.light_state(state))):
        x = segment(4, 2).requires_grad_(True)
        (layer(x, start)[0] ** 2).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_without_history_gives_the_truncated_gradient(name):
    """Inside `core.without_history()` a sensitivity core accepts its light state and its
    weight gradient is the "bptt" twin's (BPTT truncated at the segment start); outside, the
    light state is refused under autograd, and the full state's gradient differs."""
    core = make(name)
    if not core.carries_sensitivities:
        pytest.skip(f"{name}: no history term")
    twin = bptt_twin(name)
    state, x = warm_state(core, 2), segment(4, 2)

    def weight_grads(layer, start):
        layer.zero_grad()
        (layer(x, start)[0] ** 2).sum().backward()
        return [p.grad.clone() for p in layer.parameters()]

    with core.without_history():
        got = weight_grads(core, core.light_state(state))
    want = weight_grads(twin, core.light_state(state))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert not core._history_off  # the context is left
    full = weight_grads(core, state)
    assert max(max_rel_error(a, b) for a, b in zip(full, want, strict=True)) > 1e-6
    with pytest.raises(ValueError, match="silently truncated"):
        core(x, core.light_state(state))


@pytest.mark.parametrize("name", NAMES)
def test_float32_is_close_to_the_float64_reference(name):
    """float32 gradients over a 24-step history with resets: < 1e-4 relative to float64."""
    core = make(name, F32)
    if not core.exact_gradient:
        pytest.skip(f"{name} approximates the gradient; float32 adds nothing to check")
    problem = make_problem(D, N, (6, 1, 9, 8), 3, seed=5, dtype=F32)
    grads = layer_gradients(core, problem)
    p64 = {k: v.detach().double() for k, v in core.named_parameters()}
    prob64 = type(problem)(
        problem.x.double(), problem.reset, problem.readout.double(), problem.segment_lengths
    )
    ref = reference_gradients(reference_of(name), p64, prob64, truncated=core.rule == "bptt")
    err = compare({k: v.double() for k, v in grads.items()}, ref)
    assert err.max_rel_error < 1e-4, str(err)


class _Incomplete(RecurrentCore):
    def forward(self, x, state, reset=None, carry=True):
        return x, state


def test_the_base_is_abstract_and_checks_sizes_and_rules():
    with pytest.raises(TypeError, match="initial_state"):
        _Incomplete(D, N, "bptt")
    with pytest.raises(ValueError, match="sizes must be positive"):
        make("lstm-bptt").__class__(0, N)
    with pytest.raises(ConfigError, match="unknown rule 'rtrl'"):
        make("lstm-bptt").__class__(D, N, "rtrl")
