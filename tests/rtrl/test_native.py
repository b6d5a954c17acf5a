"""The native eLSTM carry kernel (r2ac.rtrl.elstm.native): same numbers as the PyTorch path.

It runs only in float32 on CPU, so it is checked three ways: against the PyTorch path on the
same float32 operands (tight, rounding-level), against full BPTT in float64 through the layer
(float32-level), and for its fallbacks (no compiler, layouts it does not take).
"""

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from r2ac.rtrl import ELSTM
from r2ac.rtrl.elstm import math as em
from r2ac.rtrl.elstm import native
from r2ac.rtrl.gradcheck import compare, layer_gradients, make_problem, reference_gradients
from r2ac.rtrl.reference import elstm_reference

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
needs_kernel = pytest.mark.skipif(not HAS_CC, reason="no C compiler")


def test_kernel_builds_where_a_compiler_exists():
    if HAS_CC:
        assert native.load() is not None, "a C compiler is on PATH but the kernel did not build"
    else:
        assert native.load() is None


def random_segment(T, B, N, D, reset_steps=(), seed=0):
    """A carried state in the layer's layout, a segment's trace, its inputs and d_hat (float32)."""
    gen = torch.Generator().manual_seed(seed)
    pre_f, pre_z = torch.randn(T, B, N, generator=gen), torch.randn(T, B, N, generator=gen)
    keep = None
    if reset_steps:
        keep = torch.ones(T, B, 1)
        for t, b in reset_steps:
            keep[t, b] = 0.0
    w_f, w_z = 0.1 * torch.randn(N, generator=gen), 0.1 * torch.randn(N, generator=gen)
    _, trace = em.recurrence_forward(pre_f, pre_z, w_f, w_z, torch.randn(B, N, generator=gen), keep)
    FZ = em.zero_FZ(B, N, D)
    FZ.copy_(torch.randn(B, 2, N, D, generator=gen))
    sens = em.ELSTMSensitivity(FZ, torch.randn(B, 4, N, generator=gen))
    x = torch.randn(T, B, D, generator=gen)
    d_hat = torch.randn(B, N, generator=gen)
    return sens, trace, x, d_hat


def clone_sens(sens):
    B, _, N, D = sens.FZ.shape
    FZ = em.zero_FZ(B, N, D)  # the layer's layout, as the kernel needs
    FZ.copy_(sens.FZ)
    return em.ELSTMSensitivity(FZ, sens.wb.clone())


@needs_kernel
@pytest.mark.parametrize(
    "T, B, N, D, resets",
    [
        (50, 3, 64, 37, ()),  # D not a multiple of the 6-row tile
        (7, 2, 40, 6, ((0, 1), (4, 0))),  # 2N = 80: column ranges ending in 16-column tiles
        (1, 1, 8, 1, ()),  # the per-step case, one stream, the smallest N
        (13, 4, 24, 12, ((12, 3), (6, 2))),  # resets: a = 0 inside the segment and at its end
    ],
)
def test_native_equals_pytorch_path(T, B, N, D, resets, monkeypatch):
    sens, trace, x, d_hat = random_segment(T, B, N, D, resets)
    assert native.supports(em._stored_blocks(sens.FZ), x)
    got_sens, want_sens = clone_sens(sens), clone_sens(sens)
    got = em.history_and_carry_in_place(d_hat, got_sens, trace, x)
    monkeypatch.setattr(native, "load", lambda: None)
    want = em.history_and_carry_in_place(d_hat, want_sens, trace, x)
    for a, b in zip((*got, *got_sens), (*want, *want_sens)):
        scale = b.abs().max().item()
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6 * scale)
    if resets:  # the streams reset at the segment's last step keep nothing of FZ(t0)
        t_last = [b for t, b in resets if t == T - 1]
        for b in t_last:
            fresh = torch.bmm(
                *em._outer_sum(x[:, b : b + 1], em._carry_inputs(trace)[0][:, b : b + 1])
            )
            torch.testing.assert_close(
                em._stored_blocks(got_sens.FZ)[b].reshape(D, 2 * N), fresh[0], rtol=1e-5, atol=1e-5
            )


SHAPES = [
    (50, 3, 64, 37, ()),
    (7, 2, 40, 6, ((0, 1), (4, 0))),
    (1, 1, 8, 1, ()),
    (13, 4, 24, 12, ((12, 3), (6, 2))),
    (5, 9, 16, 7, ((2, 8),)),  # two groups of 4 streams (history, start) and one left over
]


def close_to(got, want, rtol=2e-6):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * b.abs().max().item())


@needs_kernel
@pytest.mark.parametrize("T, B, N, D, resets", SHAPES)
def test_out_of_place_carry_and_history_equal_pytorch_path(T, B, N, D, resets, monkeypatch):
    """The kernel's carry into new buffers (carry_segment) and its history alone
    (inject_gradients): the PyTorch path's numbers, and the start state left intact."""
    sens, trace, x, d_hat = random_segment(T, B, N, D, resets)
    before = [t.clone() for t in sens]
    calls = []
    for name in ("carry", "history"):
        kernel = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, _k=kernel: (calls.append(1), _k(*a))[1])
    got = (*em.carry_segment(sens, trace, x), *em.inject_gradients(d_hat, sens))
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(sens, before))
    monkeypatch.setattr(native, "load", lambda: None)
    close_to(got, (*em.carry_segment(sens, trace, x), *em.inject_gradients(d_hat, sens)))


@needs_kernel
@pytest.mark.parametrize("T, B, N, D, resets", SHAPES)
def test_first_order_start_equals_pytorch_path(T, B, N, D, resets, monkeypatch):
    """The kernel's sum for the first-order start state (start_sum): the PyTorch path's numbers
    (its blocks of 16 inputs), the sensitivities left intact."""
    sens, *_ = random_segment(T, B, N, D, resets)
    gen = torch.Generator().manual_seed(1)
    d_FZ, d_wb = torch.randn(2, N, D, generator=gen), torch.randn(4, N, generator=gen)
    before = [t.clone() for t in sens]
    calls = []
    kernel = native.start_sum
    monkeypatch.setattr(native, "start_sum", lambda *a: (calls.append(1), kernel(*a))[1])
    got = em.first_order_start(sens, d_FZ, d_wb)
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(sens, before))
    monkeypatch.setattr(native, "load", lambda: None)
    close_to((got,), (em.first_order_start(sens, d_FZ, d_wb),))


@needs_kernel
@pytest.mark.parametrize("T, B, N, D, resets", SHAPES)
def test_carry_from_gates_equals_local_derivatives_then_carry(T, B, N, D, resets, monkeypatch):
    """The actor's carry (r2ac_carry_gates: the trace derived from the gates in the kernel)
    against local_derivatives + carry_segment / carry_step in PyTorch, resets included."""
    gen = torch.Generator().manual_seed(1)
    keep = None
    if resets:
        keep = torch.ones(T, B, 1)
        for t, b in resets:
            keep[t, b] = 0.0
    w = (0.1 * torch.randn(N, generator=gen), 0.1 * torch.randn(N, generator=gen))
    pre_f, pre_z, c0 = (
        torch.randn(*shape, generator=gen) for shape in ((T, B, N),) * 2 + ((B, N),)
    )
    _, gates = em.recurrence_steps(pre_f, pre_z, *w, c0, keep)
    sens, _, x, _ = random_segment(T, B, N, D, seed=2)
    got = em.carry_from_gates(sens, gates, keep, w, x)
    assert em._stored_blocks(got.FZ) is not None  # the layer's layout, for the next carry
    monkeypatch.setattr(native, "load", lambda: None)
    want = em.carry_from_gates(sens, gates, keep, w, x)
    close_to(got, want)
    trace = em.local_derivatives(gates, *w, keep)
    close_to(want, em.carry_segment(sens, trace, x) if T > 1 else em.carry_step(sens, trace, x))


@needs_kernel
def test_layer_float32_gradients_with_the_kernel_match_float64_full_bptt(monkeypatch):
    """Through the layer (in-place carry, several segments, resets inside them): the float32
    gradient is within float32 rounding of the exact float64 one."""
    D, N, pattern = 11, 16, (5, 1, 9, 3, 7)
    torch.manual_seed(0)
    layer = ELSTM(D, N, "rtrl")
    problem = make_problem(D, N, pattern, batch_size=3, reset_prob=0.15, seed=4)
    calls = []
    kernel = native.carry_in_place
    monkeypatch.setattr(native, "carry_in_place", lambda *a: (calls.append(1), kernel(*a))[1])
    problem32 = type(problem)(problem.x.float(), problem.reset, problem.readout.float(), pattern)
    got = layer_gradients(layer, problem32)
    assert len(calls) == len(pattern)  # every segment's backward carried through the kernel
    params64 = {k: v.detach().double() for k, v in layer.named_parameters()}
    want = reference_gradients(elstm_reference, params64, problem, truncated=False)
    result = compare({k: v.double() for k, v in got.items()}, want)
    assert result.max_rel_error < 2e-5, str(result)


def test_layouts_the_kernel_does_not_take_fall_back(monkeypatch):
    sens, trace, x, d_hat = random_segment(4, 2, 6, 5)  # N = 6: not a multiple of 8
    assert not native.supports(em._stored_blocks(sens.FZ), x)
    called = []
    monkeypatch.setattr(native, "carry_in_place", lambda *a: called.append(a))
    em.history_and_carry_in_place(d_hat, sens, trace, x)
    assert not called
    s64 = em.ELSTMSensitivity(
        em.zero_FZ(2, 8, 5, dtype=torch.float64), torch.zeros(2, 4, 8, dtype=torch.float64)
    )
    assert not native.supports(em._stored_blocks(s64.FZ), x.double())


def test_a_failing_compiler_warns_once_and_leaves_the_pytorch_path(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    cache = tmp_path / "cache"  # one r2ac creates (it changes no existing folder of yours)
    monkeypatch.setenv("R2AC_NATIVE_CACHE", str(cache))
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    with pytest.warns(RuntimeWarning, match="could not be built"):
        assert native.load() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load() is None  # no second warning
    left = [p.name for p in cache.iterdir()] if cache.exists() else []
    assert [n for n in left if n != native.MARKER] == []  # no partial library


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("R2AC_NATIVE", "0")
    assert native.load() is None


@needs_kernel
def test_build_is_cached_and_atomic(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    first = native.build(compiler, tmp_path)
    stamp = first.stat().st_mtime_ns
    assert native.build(compiler, tmp_path) == first and first.stat().st_mtime_ns == stamp
    # no temp files left; the library's hash beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, first.name + ".sha256"]


def test_cache_falls_back_to_a_temp_folder_when_home_is_unusable(monkeypatch, tmp_path):
    monkeypatch.delenv("R2AC_NATIVE_CACHE", raising=False)
    home = tmp_path / "home"
    home.write_text("a file, so no folder can be made under it (even as root)")
    monkeypatch.setattr(native.Path, "home", staticmethod(lambda: home))
    assert native.cache_dir() == Path(tempfile.gettempdir()) / f"r2ac-native-{os.getuid()}"
    monkeypatch.setenv("R2AC_NATIVE_CACHE", str(tmp_path / "mine"))
    assert native.cache_dir() == tmp_path / "mine"


@needs_kernel
@pytest.mark.parametrize("B", [1, 3])  # 2 threads: fewer streams than threads, an uneven split
def test_carry_without_history_splits_streams_or_columns_to_the_same_numbers(B, monkeypatch):
    """Without a history the kernel splits the streams between threads when there are at
    least as many streams as threads (each block swept in order), else the columns: the same
    arithmetic per element, so 1 and 2 threads agree bit for bit, and both the PyTorch path."""
    sens, trace, x, _ = random_segment(9, B, 24, 13, ((4, 0),))
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(em.carry_segment(sens, trace, x))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    monkeypatch.setattr(native, "load", lambda: None)
    close_to(results[1], em.carry_segment(sens, trace, x))
