"""The fused GPU carry's candidates on CUDA (r2ac.rtrl.elstm.gpu_carry): each, asked for by name,
equals the PyTorch path at shapes whose tiles are cut short and at the paper's size; the eLSTM
trained under each equals the CPU; and the automatic choice measures them all and drops none."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from r2ac.rtrl import ELSTM
from r2ac.rtrl.elstm import gpu_carry
from r2ac.rtrl.gradcheck import compare, layer_gradients, make_problem

from .common import F32, F64, needs_cuda

pytestmark = needs_cuda

HAS_TRITON = importlib.util.find_spec("triton") is not None
CANDIDATES = [
    "torch",
    "compile",
    pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton")),
    "compile-graph",
    pytest.param("triton-graph", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton")),
]
# (T, B, N, D): tiles cut short in both directions, a per-step segment, the paper's layer.
SHAPES = [(7, 5, 40, 37), (1, 5, 40, 37), (20, 8, 512, 257)]
EXACT = {F64: 1e-12, F32: 1e-5}  # against the PyTorch path on the same GPU


def operands(T, B, N, D, dtype, seed=0):
    """stored (B, D, 2, N), wb, fh, zh, a, cp, x, d_hat on CUDA; stream 0 restarts inside."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype, device="cuda")

    a = torch.rand(T, B, N, generator=gen, dtype=dtype, device="cuda")
    a[T // 2, 0] = 0.0
    return [rand(B, D, 2, N), rand(B, 4, N), rand(T, B, N), rand(T, B, N), a, rand(T, B, N),
            rand(T, B, D), rand(B, N)]  # fmt: skip


def _results(op, args):
    """gpu_carry.run's results on copies of args (and the selection it made)."""
    args = [t.clone() for t in args]
    out = (
        gpu_carry.run(op, *args) if op == "carry" else gpu_carry.run(op, args[0], args[1], args[7])
    )
    return gpu_carry._results(op, out, args)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("candidate", CANDIDATES)
def test_each_candidate_equals_the_torch_path(monkeypatch, candidate, shape, dtype):
    args = operands(*shape, dtype)
    for op in gpu_carry.OPS:
        monkeypatch.setenv(gpu_carry.ENV, "torch")
        want = _results(op, args)
        gpu_carry.reset()  # same operand signature: select again
        monkeypatch.setenv(gpu_carry.ENV, candidate)
        got = _results(op, args)
        err = gpu_carry.max_relative_error(got, want)
        print(f"{candidate}/{op} {shape} {dtype}: max rel error vs torch path {err:.1e}")
        assert err < EXACT[dtype], (op, err)
        assert gpu_carry.selections()[-1].name == candidate  # not dropped
        gpu_carry.reset()


@pytest.mark.parametrize("candidate", CANDIDATES)
def test_the_elstm_trained_under_each_candidate_equals_the_cpu(monkeypatch, candidate):
    monkeypatch.setenv(gpu_carry.ENV, candidate)
    torch.manual_seed(0)
    cpu = ELSTM(37, 40, "rtrl", dtype=F64)
    gpu = ELSTM(37, 40, "rtrl", dtype=F64, device="cuda")
    gpu.load_state_dict(cpu.state_dict())
    problem = make_problem(37, 40, (3, 1, 6, 1, 9), 5, reset_prob=0.15, seed=4, dtype=F64)
    want = layer_gradients(cpu, problem)
    on_gpu = type(problem)(
        problem.x.cuda(), problem.reset.cuda(), problem.readout.cuda(), problem.segment_lengths
    )
    got = layer_gradients(gpu, on_gpu)
    result = compare({k: v.cpu() for k, v in got.items()}, want)
    print(f"{candidate}: eLSTM gradients cuda vs cpu {result.max_rel_error:.1e}")
    assert result.max_rel_error < 1e-10, str(result)
    assert gpu_carry.selections() and {s.name for s in gpu_carry.selections()} == {candidate}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_the_automatic_choice_measures_every_candidate_and_drops_none(dtype):
    args = operands(50, 32, 512, 257, dtype)
    _results("carry", args)
    _results("history", args)
    expected = {"torch", "compile", "compile-graph"}
    expected |= {"triton", "triton-graph"} if HAS_TRITON else set()
    for s in gpu_carry.selections():
        print(
            f"{s.op} {s.dtype}: chose {s.name}; ms "
            + ", ".join(f"{k} {v:.3f}" for k, v in s.ms.items())
        )
        assert set(s.ms) == expected and not s.failed, s
        assert s.name == min(s.ms, key=s.ms.get)
