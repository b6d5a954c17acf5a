"""The GPU carry's candidates and their selection (r2ac.rtrl.elstm.gpu_carry), checked on the CPU:
the compiler's math and the Triton kernel (under triton's interpreter, where triton is
installed) equal elstm_math's PyTorch path; a candidate that fails or disagrees is dropped
with one warning and the PyTorch path runs. On CUDA, tests/gpu/ runs them for real."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl.elstm import carry_math as cm
from r2ac.rtrl.elstm import gpu_carry as gc
from r2ac.rtrl.elstm import math as em

F32, F64 = torch.float32, torch.float64


@pytest.fixture(autouse=True)
def _fresh_selection(monkeypatch):
    monkeypatch.delenv(gc.ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gc.reset()
    yield
    gc.reset()


def operands(T=4, B=3, N=8, D=5, dtype=F64, seed=0):
    """stored (B, D, 2, N), wb, fh, zh, a, cp (T, B, N), x (T, B, D), d_hat (B, N); a stream
    restarts inside the segment (a = 0) and x is a strided view, as the layer passes them."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    a = torch.rand(T, B, N, generator=gen, dtype=dtype)
    a[T // 2, 0] = 0.0
    x = rand(B, T, D).transpose(0, 1)  # (T, B, D), not contiguous
    return [rand(B, D, 2, N), rand(B, 4, N), rand(T, B, N), rand(T, B, N), a, rand(T, B, N), x,
            rand(B, N)]  # fmt: skip


def results(op, fn, args):
    """fn's gradients (and for "carry" the overwritten stored, wb) on copies of `args`."""
    args = [t.clone() for t in args]
    return gc._results(op, fn(*args) if op == "carry" else fn(args[0], args[1], args[7]), args)


def torch_results(op, args):
    return results(op, gc.CANDIDATES["torch"](op), args)


def test_suffix_products_equal_carry_factors():
    a = torch.rand(6, 3, 4, dtype=F64)
    a[2, 1] = 0.0
    g, G = em.carry_factors(a)
    torch.testing.assert_close(cm.suffix_products(a), g, rtol=1e-15, atol=0)
    u, G2 = cm.carry_inputs(torch.ones_like(a), torch.ones_like(a), a)
    torch.testing.assert_close(G2, G, rtol=1e-15, atol=0)
    assert float(G2[1].abs().sum()) == 0.0 < float(G2[0].abs().min())  # stream 1 restarted


@pytest.mark.parametrize("dtype, tol", [(F64, 1e-12), (F32, 1e-5)])
@pytest.mark.parametrize("T", [1, 4, 9])
def test_the_compilers_math_run_eagerly_equals_the_torch_path(T, dtype, tol):
    args = operands(T, dtype=dtype, seed=T)
    for op, fn in (("carry", gc.fused_history_and_carry), ("history", gc.fused_history)):
        want, got = torch_results(op, args), results(op, fn, args)
        assert [t.shape for t in got] == [t.shape for t in want]
        err = gc.max_relative_error(got, want)
        assert err < tol, (op, err)
        if op == "carry":  # teeth: the carry changed FZ and wb
            assert gc.max_relative_error(got[2:], args[:2]) > 0.1


@pytest.mark.slow  # inductor compiles each variant on the CPU: ~30 s on a loaded 2-core box
def test_the_compiled_candidate_equals_the_torch_path():
    for T in (1, 4, 9):  # 1 specialises; the others share one dynamic-shape graph
        args = operands(T, seed=T)
        for op in gc.OPS:
            err = gc.max_relative_error(
                results(op, gc.CANDIDATES["compile"](op), args), torch_results(op, args)
            )
            print(f"compile/{op} T={T}: max rel error vs torch path {err:.1e}")
            assert err < 1e-12, (op, T, err)


def _raise(*_):
    raise RuntimeError("the compiler broke")


def test_a_failing_candidate_falls_back_to_torch_with_one_warning(monkeypatch):
    monkeypatch.setitem(gc.CANDIDATES, "compile", lambda op: _raise)
    monkeypatch.setenv(gc.ENV, "compile")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for T in (2, 3):  # two operand signatures: two selections, one warning
            args = operands(T, seed=T)
            want = torch_results("carry", args)
            got = gc._results("carry", gc.run("carry", *args), args)
            assert gc.max_relative_error(got, want) == 0.0
    assert len(caught) == 1 and issubclass(caught[0].category, RuntimeWarning)
    assert "'compile' dropped (RuntimeError: the compiler broke)" in str(caught[0].message)
    assert [s.name for s in gc.selections()] == ["torch", "torch"]
    assert "compile" in gc.selections()[0].failed


def test_auto_times_the_candidates_and_drops_one_that_disagrees(monkeypatch):
    monkeypatch.setitem(gc.CANDIDATES, "compile", lambda op: gc.fused_history_and_carry)
    args = operands(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a correct candidate warns about nothing
        gc.run("carry", *[t.clone() for t in args])
    first = gc.selections()[0]
    assert set(first.ms) == {"compile", "torch"} and first.name == min(first.ms, key=first.ms.get)
    assert "triton" in first.unavailable and not first.failed  # a CPU tensor: silently skipped

    def wrong(*a):
        hist, d_wb = gc.fused_history_and_carry(*a)
        return hist * (1 + 1e-6), d_wb

    gc.reset()
    monkeypatch.setitem(gc.CANDIDATES, "compile", lambda op: wrong)
    with pytest.warns(RuntimeWarning, match="differs from the torch path by 1.00e-06"):
        gc.run("carry", *[t.clone() for t in args])
    assert gc.selections()[0].name == "torch" and "compile" in gc.selections()[0].failed


def test_asking_for_triton_where_it_cannot_run_warns_once(monkeypatch):
    monkeypatch.setenv(gc.ENV, "triton")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for B in (2, 3):
            stored, wb, *_, d_hat = operands(2, B=B)
            gc.run("history", stored, wb, d_hat)
    assert len(caught) == 1 and "'triton' dropped" in str(caught[0].message)
    assert [s.name for s in gc.selections()] == ["torch", "torch"]


@pytest.mark.parametrize("name", ["compile-graph", "triton-graph"])
def test_asking_for_a_cuda_graph_on_the_cpu_warns_and_keeps_the_torch_path(monkeypatch, name):
    monkeypatch.setenv(gc.ENV, name)
    args = operands(3)
    with pytest.warns(RuntimeWarning, match=f"'{name}' dropped .*CUDA graphs need a CUDA"):
        got = gc._results("carry", gc.run("carry", *args), args)
    assert gc.max_relative_error(got, torch_results("carry", operands(3))) == 0.0
    assert gc.selections()[0].name == "torch" and name in gc.selections()[0].failed


def test_auto_skips_the_cuda_graph_candidates_silently_off_cuda(monkeypatch):
    monkeypatch.setitem(gc.CANDIDATES, "compile", lambda op: gc.fused_history_and_carry)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc.run("carry", *operands(3))
    unavailable = gc.selections()[0].unavailable
    assert unavailable["compile-graph"] == "CUDA graphs need a CUDA device"
    assert unavailable["triton-graph"] == "CUDA graphs need a CUDA device"


def test_an_unknown_choice_is_a_config_error(monkeypatch):
    monkeypatch.setenv(gc.ENV, "cuda-magic")
    with pytest.raises(ConfigError, match="R2AC_GPU_CARRY='cuda-magic': choose one of auto"):
        gc.requested()


def test_the_cpu_keeps_its_path_and_selects_nothing():
    args = operands(3)
    sens = em.ELSTMSensitivity(args[0].permute(0, 2, 3, 1), args[1])
    trace = em.RecurrenceTrace(*args[2:6])
    got = [*gc.history_and_carry_in_place(args[7], sens, trace, args[6]), args[0], args[1]]
    assert gc.max_relative_error(got, torch_results("carry", operands(3))) == 0.0
    assert gc.selections() == []


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA here: tests/gpu runs the kernel")
@pytest.mark.parametrize(
    "shares, launch",
    [
        (1, None),
        (3, None),
        (2, "32x128 t16 w8 s2 ieee p4"),
        (2, "32x64 t16 w4 s- tf32x3 p4 streams"),
    ],
)  # launch: $R2AC_TRITON_CONFIG (None: the default), tiles and chunks cut short differently
def test_the_triton_kernel_under_the_interpreter_equals_the_torch_path(monkeypatch, shares, launch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the kernel is decorated
    if launch:
        monkeypatch.setenv("R2AC_TRITON_CONFIG", launch)
    sys.modules.pop("r2ac.rtrl.elstm.gpu_triton", None)
    try:
        gt = importlib.import_module("r2ac.rtrl.elstm.gpu_triton")
        monkeypatch.setattr(gt, "_stream_shares", lambda B, tiles, device, per_sm: shares)
        for dtype, tol, T in ((F64, 1e-12, 5), (F32, 1e-5, 5), (F32, 1e-5, 40)):
            # tiles cut short in D and 2N; float32 sums steps by tl.dot in chunks of 32 steps:
            # T = 40 is a whole chunk and a cut one
            args = operands(T=T, B=6, N=40, D=37, dtype=dtype)
            for op in gc.OPS:
                fn = gt.history_and_carry if op == "carry" else gt.history
                err = gc.max_relative_error(results(op, fn, args), torch_results(op, args))
                assert err < tol, (op, dtype, err)
    finally:
        sys.modules.pop("r2ac.rtrl.elstm.gpu_triton", None)  # compiled kernels for later imports


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_triton_launch_config_reads_back_and_bad_text_is_one_config_error():
    from r2ac.rtrl.elstm import gpu_triton as gt

    configs = [
        gt.KernelConfig(128, 32, 16, 8, 3, "tf32", 2),
        gt.KernelConfig(32, 64, stream_grid=True),
    ]
    for cfg in [*gt.DEFAULT_CONFIG.values(), *configs]:
        assert gt.KernelConfig.parse(cfg.describe()) == cfg
    bad_texts = (
        "64x64 t32 w4", "64x64 t32 w4 s- fp16 p4", "64by64 t32 w4 s- tf32 p4",
        "64x64 t32 w4 s- tf32 p4 pre", "64x64 t32 w4 s- tf32 p4 streams streams",
    )  # fmt: skip
    for bad in bad_texts:
        with pytest.raises(ConfigError, match="R2AC_TRITON_CONFIG=.*expected e.g."):
            gt.KernelConfig.parse(bad)
