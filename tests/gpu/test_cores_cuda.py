"""Every registered core on CUDA equals the same core on the CPU: outputs of every segment,
the end state (sensitivities included) and the accumulated parameter gradients, over several
segments (per-step ones among them) with resets inside segments and on their first step."""

from __future__ import annotations

import pytest
import torch

from r2ac.rtrl import core_names, make_core
from r2ac.rtrl.elstm import gpu_carry

from .common import F32, F64, TOLERANCE, needs_cuda, rel_error, tensor_leaves

pytestmark = needs_cuda

D, N, B = 6, 8, 3
SEGMENTS = (3, 1, 5, 1, 7)  # starts at t = 0, 3, 4, 9, 10
RESETS = ((1, 0), (6, 1), (9, 2), (13, 0))  # (t, stream): inside, inside, at a start, inside


def problem(dtype: torch.dtype, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    T = sum(SEGMENTS)
    x = torch.randn(T, B, D, generator=gen, dtype=dtype)
    readout = torch.randn(T, B, N, generator=gen, dtype=dtype)
    reset = torch.zeros(T, B, dtype=torch.bool)
    for t, b in RESETS:
        reset[t, b] = True
    return x, reset, readout


def run_segments(core, x, reset, readout):
    """Segment by segment from the zero state, one backward each (a learner at lr 0):
    the outputs, the end state's tensors and the accumulated gradients."""
    core.zero_grad(set_to_none=True)
    state, outputs, t0 = core.initial_state(B), [], 0
    for T in SEGMENTS:
        span = slice(t0, t0 + T)
        y, state = core(x[span], state, reset=reset[span])
        (y * readout[span]).sum().backward()
        outputs.append(y.detach())
        t0 += T
    grads = {name: p.grad for name, p in core.named_parameters()}
    return torch.cat(outputs), tensor_leaves(state), grads


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", core_names())
def test_a_core_on_cuda_equals_the_cpu(name, dtype):
    torch.manual_seed(0)
    cpu = make_core(name, D, N, dtype=dtype)
    gpu = make_core(name, D, N, dtype=dtype, device="cuda")
    gpu.load_state_dict(cpu.state_dict())
    x, reset, readout = problem(dtype)
    y_cpu, state_cpu, grads_cpu = run_segments(cpu, x, reset, readout)
    y_gpu, state_gpu, grads_gpu = run_segments(gpu, x.cuda(), reset.cuda(), readout.cuda())
    assert y_gpu.is_cuda and all(t.is_cuda for t in state_gpu)
    errors = {"outputs": rel_error(y_gpu, y_cpu)}
    assert len(state_gpu) == len(state_cpu) >= 1
    errors |= {f"state[{i}]": rel_error(g, c) for i, (g, c) in enumerate(zip(state_gpu, state_cpu))}
    assert grads_gpu.keys() == grads_cpu.keys()
    errors |= {f"grad {k}": rel_error(grads_gpu[k], grads_cpu[k]) for k in grads_cpu}
    worst = max(errors, key=errors.get)
    print(f"{name} {dtype}: max rel error cuda vs cpu {errors[worst]:.1e} ({worst})")
    assert errors[worst] < TOLERANCE[dtype], errors
    assert all(float(g.norm()) > 0 for g in grads_cpu.values())  # every parameter was reached
    if name.startswith("elstm-") and not name.endswith("bptt"):  # the fused carry ran
        assert {s.op for s in gpu_carry.selections()} == {"carry"}
        assert not [s.failed for s in gpu_carry.selections() if s.failed]  # no candidate dropped
